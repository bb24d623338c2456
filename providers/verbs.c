/* verbs: InfiniBand and RoCE through rdma-core. The reason xport exists:
 * tried first. Obligations (FI_MR_LOCAL, virtual addresses, provider keys,
 * FI_RX_CQ_DATA, 4-byte immediate data) come from fi_getinfo itself. */
#include "xport_int.h"

#include <stdlib.h>

/* A receive shorter than the message fails with IBV_WC_LOC_LEN_ERR (or,
 * on rxe, IBV_WC_LOC_QP_OP_ERR), which libfabric 1.17 passes on as a
 * generic FI_EIO. It also moves the queue pair to the error state: the
 * connection ends with it. */
static int verbs_cq_error(int fi_err, int prov_errno, int is_recv)
{
  (void)fi_err;
  if (is_recv && (prov_errno == 1 /* LOC_LEN_ERR */ || prov_errno == 2 /* LOC_QP_OP_ERR */))
    return -XPORT_ETRUNC;
  /* The peer's device stopped answering (its node or process died before
   * the connection manager could say so): the peer is gone, as on every
   * provider (xport(7), OUTCOMES). */
  if (prov_errno == 12 /* RETRY_EXC_ERR */ || prov_errno == 13 /* RNR_RETRY_EXC_ERR */)
    return -XPORT_ECONNRESET;
  /* The target refused the key (revoked, forged, out of range): verbs
   * names it, where the other providers can only drop the connection. */
  if (!is_recv && prov_errno == 10 /* IBV_WC_REM_ACCESS_ERR */)
    return -XPORT_EACCES;
  return 0;
}

/* libfabric's registration cache (on by default for verbs) registers
 * every buffer with every remote right, may answer a registration with a
 * larger cached one, and keeps it registered after fi_close: a key would
 * outlive its deregistration and exceed its range and rights. Off, unless
 * the user set it. */
static void verbs_preinit(void)
{
  if (getenv("FI_MR_CACHE_MAX_COUNT")) {
    XPORT__INFO("FI_MR_CACHE_MAX_COUNT is set: with libfabric's registration cache on, "
                "verbs keys may outlive xport_mr_dereg and exceed their range");
    return;
  }
  setenv("FI_MR_CACHE_MAX_COUNT", "0", 0);
}

/* libfabric before 2.2 posts an atomic's operand address where the
 * device wants its value (verbs_ep.c: compare_add = (uintptr_t)buf), so
 * that a fetch-add of 5 adds a pointer. fi_query_atomic says yes anyway. */
static const char *verbs_atomics_untrusted(void)
{
  return fi_version() < FI_VERSION(2, 2)
             ? "libfabric before 2.2 sends the operand's address as its value"
             : NULL;
}

const struct xport__profile xport__profile_verbs = {
  .name = "verbs",
  .rank = 10,
  .explicit_only = NULL,
  .manual_progress = 0,
  .inject_needs_completion = 1,
  .cq_error = verbs_cq_error,
  /* RC: the target's device acknowledges every write before it completes
   * here, yet 1.17 does not list FI_DELIVERY_COMPLETE in its op_flags. */
  .writes_acked = 1,
  .preinit = verbs_preinit,
  .atomics_untrusted = verbs_atomics_untrusted,
};
