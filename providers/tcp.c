/* tcp: runs anywhere. Reports FI_PROGRESS_AUTO, yet nothing moves (not
 * even an RMA aimed at an idle target) unless someone reads the CQ. */
#include "xport_int.h"

const struct xport__profile xport__profile_tcp = {
  .name = "tcp",
  .rank = 20,
  .explicit_only = NULL,
  .manual_progress = 1,
  /* Its send queue has no bound (a million fi_inject calls accepted):
   * only completions can hold senders to tx_depth. */
  .inject_needs_completion = 1,
  .cm_header = 32, /* struct ofi_ctrl_hdr, then the connection's private data */
};
