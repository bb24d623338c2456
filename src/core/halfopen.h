/* Sockets on a listener's port that never finish a request (core/halfopen.c). */
#ifndef XPORT_CORE_HALFOPEN_H
#define XPORT_CORE_HALFOPEN_H

#include "objects.h"

/* Shuts sockets on ctx's listeners' ports that have not delivered a
 * complete connection request (the provider's cm_header and greeting
 * bytes) within XPORT__GREET_MS, or sooner where descriptors run short;
 * looks at most twice a second. Called with the ctx lock held, from the
 * transport's progress. */
void xport__halfopen_watch(struct xport__lane *lane, size_t greeting);

#endif /* XPORT_CORE_HALFOPEN_H */
