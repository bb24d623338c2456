/* The one table of error codes and their strings, and the mapping from
 * libfabric's codes into xport's. */
#include "xport_int.h"

XPORT_API const char *xport_strerror(int code)
{
  if (code < 0)
    code = -code;
  switch (code) {
  case 0:
    return "success";
#define XPORT__ERRNO_STR(name, value, msg)                                   \
  case XPORT_##name:                                                         \
    return msg;
    XPORT_ERRNO_MAP(XPORT__ERRNO_STR)
#undef XPORT__ERRNO_STR
  default:
    return "unknown error code";
  }
}

int xport__err_from_fi(int fi_err)
{
  if (fi_err < 0)
    fi_err = -fi_err;
  switch (fi_err) {
  case 0:
    return 0;
  case FI_ETRUNC:
    return -XPORT_ETRUNC;
  case FI_ENOKEY:
    return -XPORT_EACCES;
  case FI_ENODATA:
  case FI_ENOENT:
    return -XPORT_ENOENT;
  case FI_EOPNOTSUPP:
  case FI_ENOSYS:
    return -XPORT_ENOSYS;
  case FI_ENOTCONN:
  case FI_ESHUTDOWN:
    return -XPORT_ENOTCONN;
  case FI_ECONNABORTED:
  case FI_ECONNRESET:
  case EPIPE:
    return -XPORT_ECONNRESET;
  case FI_ENETUNREACH:
  case FI_EHOSTUNREACH:
    return -XPORT_EHOSTUNREACH;
  case FI_ETOOSMALL:
  case FI_EMSGSIZE:
    return -XPORT_EMSGSIZE;
  }
  /* Codes with an errno value of their own pass through unchanged. */
  switch (fi_err) {
#define XPORT__ERRNO_PASS(name, value, msg)                                  \
  case XPORT_##name:                                                         \
    return (value) < 256 ? -(value) : -XPORT_EPROVIDER;
    XPORT_ERRNO_MAP(XPORT__ERRNO_PASS)
#undef XPORT__ERRNO_PASS
  }
  return -XPORT_EPROVIDER;
}

int xport__err_known(int code)
{
  switch (-code) {
  case 0:
#define XPORT__ERRNO_KNOWN(name, value, msg) case XPORT_##name:
    XPORT_ERRNO_MAP(XPORT__ERRNO_KNOWN)
#undef XPORT__ERRNO_KNOWN
    return 1;
  default:
    return 0;
  }
}

const char *xport__err_hint(int code)
{
  switch (-code) {
  case XPORT_ETRUNC:
    return "post a receive buffer at least as large as the largest message";
  case XPORT_ECANCELED:
    return "the connection was closed, locally or by the peer, with the "
           "operation outstanding";
  case XPORT_ECONNRESET:
  case XPORT_ENOTCONN:
    return "the peer closed the connection or its process died";
  case XPORT_EACCES:
    return "the remote key was revoked or never granted this access";
  case XPORT_ENOMEM:
    return "registration may exceed the locked-memory limit: see ulimit -l";
  case XPORT_ETIMEDOUT:
    return "no answer in time: the target may have refused the remote key";
  default:
    return NULL;
  }
}
