/* Codes from libfabric's, and what xport_strerror adds (util/error.c). */
#ifndef XPORT_UTIL_ERROR_H
#define XPORT_UTIL_ERROR_H

#include "base.h"

/* Maps a libfabric return or completion code (either sign) to -XPORT_E*. */
int xport__err_from_fi(int fi_err);
/* 1 if code is 0 or the negative of one of xport's codes. */
int xport__err_known(int code);
/* A one-line hint for a failed completion, or NULL. */
const char *xport__err_hint(int code);

#endif /* XPORT_UTIL_ERROR_H */
