/*
 * Internal header shared by the core (src/) and the provider profiles
 * (providers/): the umbrella over one header per module, in layer order.
 * Tools and examples never include it.
 */
#ifndef XPORT_INT_H
#define XPORT_INT_H

#include "util/base.h"
#include "util/log.h"
#include "util/env.h"
#include "util/auth.h"
#include "util/error.h"
#include "util/random.h"
#include "util/addr.h"
#include "../providers/profile.h"
#include "core/objects.h"
#include "transport/transport.h"
#include "core/cq.h"
#include "core/mem.h"
#include "core/link.h"
#include "core/halfopen.h"
#include "core/fault.h"
#include "core/pool.h"
#include "api/ctx.h"
#include "api/post.h"
#include "api/wimm.h"
#include "api/conn.h"

#endif /* XPORT_INT_H */
