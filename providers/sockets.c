/* sockets: functional but answers in milliseconds per message here, so
 * it must never be picked by default. */
#include "xport_int.h"

const struct xport__profile xport__profile_sockets = {
  .name = "sockets",
  .rank = 90,
  .explicit_only = "answers in milliseconds per message; used only when "
                   "named in XPORT_PROVIDER",
  .manual_progress = 1,
};
