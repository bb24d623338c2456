/* The transports xport has, by the endpoint type they run on. The one
 * file that names them; they never name each other. */
#include "xport_int.h"

#include <string.h>

extern const struct xport__transport xport__transport_msg, xport__transport_rdm,
    xport__transport_xshm;

static const struct xport__transport *const transports[] = {&xport__transport_msg,
                                                            &xport__transport_rdm};

/* Transports of xport's own provider, chosen by name (XPORT_PROVIDER).
 * The first is the default for peers on this node (XPORT_SHM=auto). */
static const struct xport__transport *const own[] = {&xport__transport_xshm};

/* Every operation the core calls without looking is there (struct
 * xport__transport says which may be NULL). */
static __attribute__((unused)) int complete(const struct xport__transport *tp)
{
  const struct xport__data_ops *d = tp->data;
  return tp->name && tp->listen && tp->listener_close && tp->connect && tp->accept &&
         tp->close_conn && tp->progress && tp->op_failed && tp->drop && d && d->send &&
         d->inject && d->recv && d->marker && d->is_marker && d->read && d->write && d->atomic;
}

const struct xport__transport *xport__transport_for(enum fi_ep_type t)
{
  for (size_t i = 0; i < sizeof transports / sizeof transports[0]; i++)
    if (transports[i]->ep_type == t) {
      XPORT__ASSERT(complete(transports[i]));
      return transports[i];
    }
  return NULL;
}

const struct xport__transport *xport__transport_named(const char *name)
{
  for (size_t i = 0; i < sizeof own / sizeof own[0]; i++)
    if (!strcmp(own[i]->name, name)) {
      XPORT__ASSERT(complete(own[i]));
      return own[i];
    }
  return NULL;
}

const struct xport__transport *xport__transport_node_local(void)
{
  XPORT__ASSERT(complete(own[0]));
  return own[0];
}
