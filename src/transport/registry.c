/* The transports xport has, by the endpoint type they run on. The one
 * file that names them; they never name each other. */
#include "xport_int.h"

extern const struct xport__transport xport__transport_msg, xport__transport_rdm;

static const struct xport__transport *const transports[] = {&xport__transport_msg,
                                                            &xport__transport_rdm};

const struct xport__transport *xport__transport_for(enum fi_ep_type t)
{
  for (size_t i = 0; i < sizeof transports / sizeof transports[0]; i++)
    if (transports[i]->ep_type == t)
      return transports[i];
  return NULL;
}
