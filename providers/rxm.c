/* ofi_rxm over tcp or verbs: reliable datagrams built on connected
 * endpoints, made lazily on the first send. Listeners bind a socket
 * address. rxm never reports a dead peer: xport watches for it. */
#include "xport_int.h"

const struct xport__profile xport__profile_tcp_rxm = {
  .name = "tcp;ofi_rxm",
  .rank = 30,
  .manual_progress = 1,
};

const struct xport__profile xport__profile_verbs_rxm = {
  .name = "verbs;ofi_rxm",
  .rank = 15,
  .manual_progress = 1,
  .inject_needs_completion = 1,
};
