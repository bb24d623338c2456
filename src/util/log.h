/* Logging (XPORT_LOG): util/log.c. */
#ifndef XPORT_UTIL_LOG_H
#define XPORT_UTIL_LOG_H

#include "base.h"

enum { XPORT__LOG_ERROR = 1, XPORT__LOG_WARN, XPORT__LOG_INFO, XPORT__LOG_DEBUG };
extern int xport__log_level;
void xport__log_init(const char *level); /* XPORT_LOG's value, or NULL */
void xport__log(int level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
#define XPORT__LOG(lvl, ...)                                                 \
  do {                                                                       \
    if (XPORT__UNLIKELY(xport__log_level >= (lvl)))                          \
      xport__log((lvl), __VA_ARGS__);                                        \
  } while (0)
#define XPORT__WARN(...) XPORT__LOG(XPORT__LOG_WARN, __VA_ARGS__)
#define XPORT__INFO(...) XPORT__LOG(XPORT__LOG_INFO, __VA_ARGS__)
#define XPORT__DEBUG(...) XPORT__LOG(XPORT__LOG_DEBUG, __VA_ARGS__)

#endif /* XPORT_UTIL_LOG_H */
