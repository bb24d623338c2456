/* Provider profiles (providers/): what xport knows of each provider,
 * measured, so that the core never names one. */
#ifndef XPORT_PROVIDERS_PROFILE_H
#define XPORT_PROVIDERS_PROFILE_H

#include "../src/util/base.h"
#include <rdma/fabric.h>

/*
 * What the core needs to know about a provider beyond what fi_getinfo
 * says. One instance per provider, in providers/<name>.c; the core looks
 * profiles up by libfabric's provider name and never names one itself.
 */
struct xport__profile {
  const char *name;        /* libfabric prov_name, e.g. as fi_info prints */
  int rank;                /* lower is tried first when not named */
  /* Non-NULL: used only when named in XPORT_PROVIDER, and this says why. */
  const char *explicit_only;
  /* Non-NULL: another local process, of any user, can take over a
   * connection unseen; this says how, in a warning given once per
   * process when a context opens on it (xport(7), SECURITY). */
  const char *takeover;
  /* 1: reports FI_PROGRESS_AUTO but moves nothing unless its CQ is read. */
  int manual_progress;
  /* 1: an injected send must still be completed by the provider (FI_INJECT
   * flag) rather than finished by xport on the spot (fi_inject): a send
   * slot is freed only by a completion (hardware queues), or the provider
   * queues injected sends without bound (tcp, rxm), so that only their
   * completions can bound them (xport's tx_depth). */
  int inject_needs_completion;
  /* Maps a failed completion's error to xport's code where the provider
   * reports something generic (may be NULL): 0 keeps the usual mapping. */
  int (*cq_error)(int fi_err, int prov_errno, int is_recv);
  /* Runs before libfabric is first asked anything (may be NULL): the
   * place to set the provider's own environment variables. */
  void (*preinit)(void);
  /* 1: a one-sided operation the target refuses (bad key, revoked
   * region) never completes, nor does any error come (shm). xport then
   * gives such operations a deadline (XPORT_RMA_TIMEOUT). */
  int rma_never_fails;
  /* NULL, or the most operations one connection may have outstanding
   * where the provider's own queue takes fewer than its tx size says (shm:
   * two of its 1024 command slots per one-sided operation; rxm over verbs:
   * its verbs connection to the peer). */
  size_t (*max_tx_depth)(void);
  /* 1: a message larger than its receive never completes (shm in
   * libfabric 1.17: the cross-memory copy spins for ever, the segmented
   * one stalls). xport then gives every receive room for any message, a
   * sink behind the caller's buffer, and reports the truncation itself;
   * this costs one iov element (max_iov) and bounds max_msg_size. */
  int truncation_hangs;
  /* 1: a tagged message that came before its receive is matched by its
   * exact tag, the receive's ignore bits left out (shm in libfabric 1.17:
   * smr_match_tagged applies the queued message's own ignore field, stale
   * or 0, not the receive's): a message under a tag bit that receives
   * ignore is then never received. xport's RDM transport marks an emulated
   * write_imm's message in the upper half of its 8-byte CQ data instead
   * of a tag bit (transport/rdm_data.c). */
  int unexpected_tag_exact;
  /* 1: the answers an endpoint awaits from its targets (to a read, a
   * delivery-complete write, a transfer too large to go inline) are taken
   * in the order their operations were posted, whatever the target, and
   * one that never comes holds up every later one (shm in libfabric 1.17:
   * one response queue per endpoint, smr_progress_resp stops at the first
   * unanswered entry): a dead target would stall every other connection
   * of the endpoint. xport then gives each destination of outgoing
   * connections an endpoint of its own (transport/rdm_ep.c, rdm_dest_rep). */
  int answers_in_order;
  /* 1: delivery-complete is on unless the user turns it off: the
   * provider drops and re-makes, without a word, a connection whose target
   * refused a key, so only a write that waits for the target learns that
   * messages around it were lost (rxm over tcp). */
  int dc_default;
  /* 1: a send to an address the provider has no connection to costs a
   * connection attempt, and memory it keeps (rxm 1.17: megabytes for each
   * attempt that fails): a listener sends nothing to the address a request
   * names until a request has come from there (transport/rdm_ctl.c, rdm_on_connreq). */
  int answer_needs_source;
  /* mr_mode bits to drop before opening the domain where the provider
   * merely allows them (shm checks keys only with offsets). */
  uint64_t clear_mr_mode;
  /* 1: the provider must not drop its connection to a peer (AV removal,
   * endpoint close) while messages from that peer may be arriving. xport
   * then waits, after a goodbye, for the peer's answer (transport/rdm.c). */
  int close_needs_quiet;
  /* 1: two endpoints of one process share memory inside the provider, and
   * closing one leaves the other pointing at freed memory (shm in
   * libfabric 1.17 uses a same-process peer's region directly and frees
   * it with its endpoint): a connection between two contexts of one
   * process is refused. */
  int in_process_peers_unsafe;
  /* 1: a write completes only once the target's device acknowledged it
   * (RC hardware), whatever the flags: delivery-complete needs no
   * FI_DELIVERY_COMPLETE, which such a provider may not even list. */
  int writes_acked;
  /* Nonzero where the provider's listener accepts TCP sockets and waits
   * on each, without a deadline, for the connection request: the bytes of
   * its own header before the transport's greeting (tcp: struct
   * ofi_ctrl_hdr, 32; rxm over it: that and rxm's 24 of its own). xport
   * then shuts such sockets that stay unfinished (src/core/halfopen.c). */
  size_t cm_header;
  /* 1: a delivery-complete operation holds the peer's channel, and
   * nothing else to that peer can be posted until it completes (shm: up
   * to 4 KiB such operations take its one segmented-copy slot). */
  int dc_holds_peer;
  /* 1: closing an endpoint leaves it in the wait set of the CQ it was
   * bound to (rxm in libfabric 1.17: rxm_ep_close never calls
   * ofi_wait_del_fid for its inner CQ), so that the next fi_trywait on that
   * CQ calls into the freed endpoint. Where the CQ has a wait fd, xport
   * then keeps such endpoints open, retired, until the context's CQ closes
   * (transport/rdm.c). */
  int retire_eps;
  /* 1: the provider keeps unexpected messages in memory it grows without
   * bound (rxm). xport then receives control messages (untagged) into
   * multi-receive buffers, one always posted, so that none waits there:
   * where the provider supports FI_MULTI_RECV. */
  int unexpected_unbounded;
  /* 1: tagged FI_PEEK, FI_PEEK|FI_DISCARD and FI_PEEK|FI_CLAIM work and
   * complete at once, into the CQ, during the call, and a claimed message
   * is received through the context its claim marked (rxm). xport then
   * discards unexpected messages under tags no connection receives, and
   * claims and counts those a connection's peer sent ahead (rdm_sink.c). */
  int peek_discard;
  /* 1: once a peer's process is gone, the provider can no longer touch
   * the buffers of operations to it (everything to that peer went through
   * connections that died with it), though it may never report them
   * (rxm: a rendezvous send waits for ever): xport completes them then,
   * and keeps their requests until the provider or the endpoint ends
   * them. 0: only the provider's report or the endpoint's close does
   * (shm copies through the dead peer's shared memory), and xport retires
   * the endpoint. */
  int dead_peer_lets_go;
  /* 1: a peer that is alive keeps using this process's buffers of
   * operations to it whatever this process does, closing the endpoint
   * included (shm: the peer copies them by cross-memory attach when it
   * serves the operation), so that no deadline can give them back:
   * connections there take none (xport_conn_timeout: XPORT_ENOSYS). */
  int hung_keeps_buffers;
  /* Non-NULL when the provider's native atomics must not be used, and
   * why (may be NULL): xport then emulates them where it can (MSG). */
  const char *(*atomics_untrusted)(void);
  /* 1: the provider offers atomics only without ordering them against
   * other operations, and then declines to promise any order but
   * send-after-send for everything (rxm 1.17: RXM_ATOMIC_UNSUPPORTED_MSG_ORDER,
   * since it runs its atomics as messages that its own progress applies,
   * while RMA and messages still go over one ordered connection as they
   * do without atomics). xport asks for atomics so, and orders atomics
   * with nothing on any provider (xport_fetch_add(3)). */
  int atomics_unordered;
  /* 1: closing an endpoint after one of its one-sided operations failed
   * (a refused key) crashes inside the provider (rxm over verbs in
   * libfabric 1.17, in its connection teardown). When the context goes,
   * xport then leaves such an endpoint, and the objects it is bound to,
   * open: memory lost at exit rather than a crash. Nor does such an
   * endpoint reach that peer again (a new connection is refused): new
   * connections go out through a fresh endpoint. */
  int close_after_refusal_crashes;
  /* 1: reaches only processes of this node that share its /dev/shm and
   * PID namespace (shm). The one provider a context opens beside its
   * fabric for same-node peers (XPORT_SHM), and whose listeners refuse a
   * request from another node or PID namespace (transport/rdm.c). */
  int node_local;
  /* What to tell the user when the provider refuses to open an endpoint
   * (fi_enable: EINVAL) for reasons of its own (may be NULL). */
  const char *enable_hint;

  /* Providers without a connection manager whose endpoints are named
   * (shm): how a listener's host:port becomes a name, and how a name is
   * owned. All NULL for providers addressed by socket address. */
  /* any 1: the name of a listener on the port's wildcard address, which
   * a client tries after the host's own (any 0). */
  int (*listen_name)(const char *host, const char *port, int any, char *name, size_t len);
  /* Takes the name for this process; -XPORT_EADDRINUSE if a live owner
   * has it. Sets *lock_p to what release_name gives back. */
  int (*claim_name)(const char *name, int *lock_p);
  void (*release_name)(const char *name, int lock);
  /* 1 if a live endpoint owns the name. */
  int (*name_alive)(const char *name);
  /* 1 if the name's owner is this process's user (may be NULL): a
   * context with shm beside its fabric reaches only such a listener over
   * shm, and another user's over the fabric, so that a local process of
   * another user cannot take a port's connections by claiming its name. */
  int (*name_same_user)(const char *name);
  /* 1 if an endpoint of that name exists now, xport's or not (a name a
   * request says it sends from, before anything is sent there). */
  int (*name_exists)(const char *name);
  /* A fresh name for an endpoint that is no listener's (may be NULL: the
   * provider's default name), taken with claim_name like a listener's, so
   * that what a killed process leaves behind is known as xport's and
   * removed by sweep, never mistaken for another program's. */
  int (*anon_name)(char *name, size_t len);
  /* Removes what endpoints of dead owners left behind under xport's
   * names; a live owner's are left alone (may be NULL). Runs when a
   * context opens. */
  void (*sweep)(void);
  /* Cleans up what a dead peer at this address left behind (may be NULL). */
  void (*peer_gone)(const void *addr, size_t len);
  /* Non-NULL where a peer crashes if our endpoint is gone before it has
   * taken the first message we sent it (shm in libfabric 1.17: the first
   * send to a peer queues our name there, and is refused, EAGAIN, until
   * the peer's progress maps it; smr_progress_connreq dereferences the
   * failed mapping of a name whose file was unlinked). 1 if the peer at
   * this address may still take it (its process lives). xport then waits,
   * at an endpoint's close, for every such peer to take it, and where one
   * never does, leaves the endpoint open (transport/rdm_ep.c, settle_names). */
  int (*peer_may_map)(const void *addr, size_t len);
  /* Watches the process pid of this node, whose endpoint is at addr, for
   * as long as it lives (may be NULL): a provider whose senders take a
   * lock in the receiver's memory (shm) gives back the one a killed
   * receiver held, which nothing else ever would (providers/shm.c). */
  void (*peer_watch)(const void *addr, size_t len, uint32_t pid);
  /* 1 while a watched peer at addr holds that lock (may be NULL): a send
   * to it now would spin inside the provider until the peer lets go, for
   * ever if it is stopped there. xport's own messages (heartbeats,
   * probes, answers) wait for the next look instead: a poll never waits
   * on a peer. */
  int (*peer_locked)(const void *addr, size_t len);
  /* keep 1: the endpoint under name (with lock, from claim_name) has such
   * a message out, or is left open at the context's end for it: its file
   * is to outlast this process by a while, however the process ends, and
   * sweep respects that; keep 0: no longer. May be NULL. */
  void (*keep_name)(const char *name, int lock, int keep);
};

/* NULL-terminated registry, providers/registry.c. */
extern const struct xport__profile *const xport__profiles[];
const struct xport__profile *xport__profile_find(const char *prov_name);

#endif /* XPORT_PROVIDERS_PROFILE_H */
