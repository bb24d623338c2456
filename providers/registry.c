/* The list of provider profiles the probe knows. Adding a provider means
 * one file in providers/ and one line here; the core does not change. */
#include "xport_int.h"

#include <string.h>

extern const struct xport__profile xport__profile_verbs;
extern const struct xport__profile xport__profile_tcp;
extern const struct xport__profile xport__profile_sockets;
extern const struct xport__profile xport__profile_shm;
extern const struct xport__profile xport__profile_tcp_rxm;
extern const struct xport__profile xport__profile_verbs_rxm;

const struct xport__profile *const xport__profiles[] = {
  &xport__profile_verbs,
  &xport__profile_tcp,
  &xport__profile_sockets,
  &xport__profile_shm,
  &xport__profile_tcp_rxm,
  &xport__profile_verbs_rxm,
  NULL,
};

const struct xport__profile *xport__profile_find(const char *prov_name)
{
  if (!prov_name)
    return NULL;
  for (size_t i = 0; xport__profiles[i]; i++)
    if (!strcmp(xport__profiles[i]->name, prov_name))
      return xport__profiles[i];
  return NULL;
}
