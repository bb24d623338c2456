/* The environment variables xport reads, declared once (util/env.c;
 * xport_info -e lists them). */
#ifndef XPORT_UTIL_ENV_H
#define XPORT_UTIL_ENV_H

#include "base.h"

enum xport__env_id {
  XPORT__ENV_PROVIDER,
  XPORT__ENV_DOMAIN,
  XPORT__ENV_IFACE,
  XPORT__ENV_LOG,
  XPORT__ENV_STRICT,
  XPORT__ENV_PROGRESS_THREAD,
  XPORT__ENV_EAGER_SIZE,
  XPORT__ENV_PEER_TIMEOUT,
  XPORT__ENV_RMA_TIMEOUT,
  XPORT__ENV_WAIT_FD,
  XPORT__ENV_KEEPALIVE,
  XPORT__ENV_DELIVERY_COMPLETE,
  XPORT__ENV_LISTEN_BACKLOG,
  XPORT__ENV_KEEPALIVE_TIMEOUT,
  XPORT__ENV_JOB,
  XPORT__ENV_JOB_HOST,
  XPORT__ENV_JOB_TIMEOUT,
  XPORT__ENV_SHM,
  XPORT__ENV_FAULT,
  XPORT__ENV_AUTH_KEY_FILE,
  XPORT__ENV_RECV_AHEAD,
  XPORT__ENV_XSHM_CMA,
  XPORT__ENV_OP_TIMEOUT,
  XPORT__ENV_POOL_LEND,
  XPORT__ENV_COUNT
};

/* The raw value of a variable, or NULL when unset or empty. */
const char *xport__env_str(enum xport__env_id id);
/* Boolean/size values; a malformed value logs a warning and gives def. */
int xport__env_bool(enum xport__env_id id, int def);
size_t xport__env_size(enum xport__env_id id, size_t def);

#endif /* XPORT_UTIL_ENV_H */
