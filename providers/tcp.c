/* tcp: runs anywhere. Reports FI_PROGRESS_AUTO, yet nothing moves (not
 * even an RMA aimed at an idle target) unless someone reads the CQ. */
#include "xport_int.h"

const struct xport__profile xport__profile_tcp = {
  .name = "tcp",
  .rank = 20,
  .explicit_only = NULL,
  .manual_progress = 1,
};
