/* ofi_rxm over tcp or verbs: reliable datagrams built on connected
 * endpoints, made lazily on the first send. Listeners bind a socket
 * address. rxm never reports a dead peer: xport watches for it.
 *
 * When rxm (libfabric 1.17) closes its connection to a peer (fi_av_remove,
 * endpoint close), it closes the underlying endpoint first and handles
 * the completions still queued for it afterwards, reposting receive
 * buffers on the freed endpoint: a message arriving from that peer just
 * then crashes the process (seen over verbs; fixed upstream by libfabric
 * commit 697688386, "fix the msg_ep use-after-free at connection
 * teardown"). Hence close_needs_quiet, and a shared receive queue over
 * verbs as over tcp (rxm_preinit), which that repost cannot hit.
 *
 * rxm_ep_close (1.17, and still upstream) leaves the endpoint's inner CQ in
 * the wait set of the CQ xport bound it to: the next fi_trywait on that CQ
 * (xport_wait, after a listener or its last connection closed) calls the
 * freed endpoint's trywait and crashes. Hence retire_eps.
 *
 * rxm keeps a message that matches no posted receive in a receive buffer
 * of its own and posts a fresh one, growing its pool without bound (a
 * flood of 20,000 untagged messages grew a server by 268 MB): hence
 * unexpected_unbounded. Its tagged FI_PEEK (and FI_DISCARD, FI_CLAIM)
 * answers in the CQ during the call: hence peek_discard, which drains what
 * strangers send under unused tags and claims, counts and bounds what a
 * connection's peer sends ahead of its receives (XPORT_RECV_AHEAD). */
#include "xport_int.h"

#include <stdlib.h>

/* A message larger than its receive must cost that receive (FI_ETRUNC)
 * and nothing else; in rxm (libfabric 1.17) two of its protocols do not
 * manage that:
 * - over tcp, rxm hands a tagged message's posted buffer straight to the
 *   tcp endpoint underneath ("dynamic receive buffers"); a message larger
 *   than the buffer fails the tcp stream in mid-message, and the tcp
 *   connection between the two rxm endpoints is dead: rxm neither reports
 *   it nor makes a new one, so every xport connection between those two
 *   endpoints stops (posts return EAGAIN, connects time out);
 * - segmented messages (SAR, between the eager and the rendezvous sizes,
 *   used once dynamic buffers are off) finish the receive at the first
 *   segment that does not fit, and the segments after it crash rxm.
 * With both off, a message up to rxm's buffer size (16 KiB) lands in
 * rxm's bounce buffer and is truncated in the copy, and a larger one goes
 * by rendezvous, which truncates cleanly too. The cost is one copy of
 * small messages. A user who sets these variables keeps the choice. */
/* Memory: over tcp an rxm endpoint preposts a shared receive queue of
 * 4,096 buffers of 16 KiB (68 MiB resident per endpoint, and a context
 * with a listener has two); buffers come in pools of 1,024, so 1,024 of
 * them (17 MiB, shared by every peer of the endpoint) cost a quarter and
 * suffice where receives are posted before the peer sends, as xport asks.
 * Not bounded here: the send buffer pool (17 MiB, at the first send) and
 * the tcp completion ring (12 MiB of address space, made resident as it
 * is first written: about 300 bytes per connection opened, up to that). */
/* Receives: rxm over verbs gives every connection receive buffers of its
 * own (over tcp it shares one queue), and closing such a connection
 * crashes rxm (libfabric 1.17) whenever a message from the peer is still
 * in its completion queue: rxm_close_conn closes the verbs endpoint,
 * then reads the queue and posts the buffer again on the endpoint it just
 * freed (rxm_flush_msg_cq -> rxm_post_recv; a peer's goodbye or heartbeat
 * racing xport_ctx_destroy, seen in the Soft-RoCE guest). With one shared
 * queue the buffer goes back to the shared queue, which is closed last.
 * Its size, 1,024 (16 MiB per endpoint), also keeps rxm's request for a
 * device completion queue (that size plus the send size times
 * FI_UNIVERSE_SIZE) within reach. */
/* Connections: rxm reads its connection manager at most once every
 * FI_OFI_RXM_CM_PROGRESS_INTERVAL microseconds (10,000 by default) while
 * none of its own connects, and tcp accepts one socket per such read: a
 * listener took at most ~100 connections a second, so that garbage
 * connections (random bytes, closed) at a higher rate filled the
 * kernel's queue and kept honest clients out for as long as they came.
 * At 1 ms it takes ten times as many, for one clock read and, once a
 * millisecond, one epoll_wait in the CQ reads. */
static void rxm_preinit(void)
{
  setenv("FI_OFI_RXM_ENABLE_DYN_RBUF", "0", 0);
  setenv("FI_OFI_RXM_SAR_LIMIT", "0", 0);
  setenv("FI_OFI_RXM_USE_SRX", "1", 0);
  setenv("FI_OFI_RXM_MSG_RX_SIZE", "1024", 0);
  setenv("FI_OFI_RXM_CM_PROGRESS_INTERVAL", "1000", 0);
}

/* libfabric 1.17's rxm names a connecting peer by the IP of its socket
 * and the port its request claims, and a second request for the same
 * name replaces the first connection: a process of any user on the
 * client's node that claims the client's port becomes the client, takes
 * what is sent to it and completes the server's receives with its own
 * messages, and neither side sees an error. Nothing xport adds to the
 * handshake survives that, as it happens after: never chosen unasked. */
#define RXM_TAKEOVER "a process of any user on a peer's node can take over a connection " \
                     "unseen, its messages included (rxm names a peer by the port it claims)"
#define RXM_EXPLICIT "a process of any user on a peer's node can take over its connections " \
                     "(xport(7), SECURITY); used only when named in XPORT_PROVIDER"

const struct xport__profile xport__profile_tcp_rxm = {
  .name = "tcp;ofi_rxm",
  .rank = 30,
  .explicit_only = RXM_EXPLICIT,
  .takeover = RXM_TAKEOVER,
  .manual_progress = 1,
  /* fi_tinject is accepted without bound (a million and more while the
   * peer had taken a tenth): only completions can hold senders back. */
  .inject_needs_completion = 1,
  .preinit = rxm_preinit,
  .close_needs_quiet = 1,
  .retire_eps = 1,
  .unexpected_unbounded = 1,
  .peek_discard = 1,
  .dead_peer_lets_go = 1,
  .answer_needs_source = 1,
  .atomics_unordered = 1,
  /* A message sent in several pieces past the eager limit (16 KiB) into a
   * smaller receive completes on neither side (rxm 1.17's rendezvous). */
  .truncation_hangs = 1,
  /* A write whose key the target refuses completes once sent, while the
   * target drops the tcp connection and rxm re-makes it silently: the
   * messages around it are lost on a connection that looks fine. */
  .dc_default = 1,
  /* tcp's struct ofi_ctrl_hdr, then rxm's own request (union rxm_cm_data) */
  .cm_header = 32 + 24,
};

/* rxm over verbs passes the verbs connection's work-completion status on
 * as the error's prov_errno, and a generic FI_EIO as the error: a target
 * that refused the key (IBV_WC_REM_ACCESS_ERR) is a refusal, as on verbs. */
static int verbs_rxm_cq_error(int fi_err, int prov_errno, int is_recv)
{
  (void)fi_err;
  if (!is_recv && prov_errno == 10 /* IBV_WC_REM_ACCESS_ERR */)
    return -XPORT_EACCES;
  return 0;
}

/* rxm's one-sided operations go straight to its verbs connection to the
 * peer and fail with EAGAIN once its send queue is full: that queue
 * (FI_OFI_RXM_MSG_TX_SIZE, 128 by default, RXM_MSG_RXTX_SIZE in 1.17) is
 * what a connection can count on. Beyond it verbs reaps a completion at
 * post now and then, so more are taken or not, by timing. */
static size_t verbs_rxm_tx_depth(void)
{
  const char *v = getenv("FI_OFI_RXM_MSG_TX_SIZE");
  char *end;
  unsigned long n = v ? strtoul(v, &end, 10) : 0;
  return n && !*end ? (size_t)n : 128;
}

const struct xport__profile xport__profile_verbs_rxm = {
  .name = "verbs;ofi_rxm",
  .rank = 15,
  .explicit_only = RXM_EXPLICIT,
  .takeover = RXM_TAKEOVER,
  .manual_progress = 1,
  .inject_needs_completion = 1,
  .preinit = rxm_preinit,
  .close_needs_quiet = 1,
  .retire_eps = 1,
  .unexpected_unbounded = 1,
  .peek_discard = 1,
  .dead_peer_lets_go = 1,
  .answer_needs_source = 1,
  .atomics_unordered = 1,
  /* Not truncation_hangs: the sink is not registered memory, which a
   * rendezvous over verbs reads into (every transfer past 16 KiB then
   * failed, measured in the test guest). */
  .close_after_refusal_crashes = 1,
  .max_tx_depth = verbs_rxm_tx_depth,
  .cq_error = verbs_rxm_cq_error,
  .enable_hint = "rxm asks the device for a completion queue of (receive + send queue "
                 "size) x FI_UNIVERSE_SIZE (default 256) entries, more than some devices "
                 "allow (Soft-RoCE: 32767); set FI_UNIVERSE_SIZE=64, or "
                 "FI_OFI_RXM_MSG_RX_SIZE and FI_OFI_RXM_MSG_TX_SIZE",
};
