/* verbs: InfiniBand and RoCE through rdma-core. The reason xport exists:
 * tried first. Obligations (FI_MR_LOCAL, virtual addresses, provider keys,
 * FI_RX_CQ_DATA, 4-byte immediate data) come from fi_getinfo itself. */
#include "xport_int.h"

const struct xport__profile xport__profile_verbs = {
  .name = "verbs",
  .rank = 10,
  .explicit_only = NULL,
  .manual_progress = 0,
};
