/* Logging to stderr, filtered by XPORT_LOG (its value given by the caller:
 * the environment's table logs its own complaints through here). */
#include "xport_int.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

int xport__log_level = XPORT__LOG_WARN;

void xport__log_init(const char *v)
{
  static const char *const names[] = {"none", "error", "warn", "info", "debug"};
  if (!v)
    return;
  for (int i = 0; i < 5; i++)
    if (!strcasecmp(v, names[i])) {
      xport__log_level = i;
      return;
    }
  fprintf(stderr, "xport: warn: XPORT_LOG=%s is not one of none, error, "
                  "warn, info, debug\n", v);
}

void xport__log(int level, const char *fmt, ...)
{
  static const char *const tags[] = {"", "error", "warn", "info", "debug"};
  char line[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  fprintf(stderr, "xport: %s: %s\n", tags[level], line);
}

#ifdef XPORT_ASSERTS
void xport__assert_fail(const char *what, const char *file, int line)
{
  fprintf(stderr, "xport: %s:%d: invariant broken: %s\n", file, line, what);
  abort();
}
#endif
