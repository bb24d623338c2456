/* The shared key that connections prove (xport(7), AUTHENTICATION): where
 * it comes from, and the keyed MAC and nonces of the handshakes, all from
 * libsodium. The transports build the transcripts; nothing here knows a
 * wire format. The key never reaches a log line. */
#include "xport_int.h"

#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

_Static_assert(XPORT__AUTH_KEY == crypto_auth_KEYBYTES, "a MAC key is what crypto_auth takes");
_Static_assert(XPORT__AUTH_MAC == crypto_auth_BYTES, "a proof is crypto_auth's output");

/* A key file larger than this is not a key someone meant. */
#define KEY_FILE_MAX 4096

int xport__auth_init(void)
{
  return sodium_init() < 0 ? -XPORT_EPROVIDER : 0;
}

/* Any length of at least XPORT_AUTH_KEY_MIN bytes becomes one MAC key,
 * so that a pass phrase and 32 random bytes serve alike. */
int xport__auth_key(const void *raw, size_t len, uint8_t key[XPORT__AUTH_KEY])
{
  static const char what[] = "xport connection key v1";
  crypto_generichash_state st;
  if (!raw || len < XPORT__AUTH_KEY_MIN)
    return -XPORT_EINVAL;
  if (xport__auth_init())
    return -XPORT_EPROVIDER;
  crypto_generichash_init(&st, NULL, 0, XPORT__AUTH_KEY);
  crypto_generichash_update(&st, (const unsigned char *)what, sizeof what);
  crypto_generichash_update(&st, raw, len);
  crypto_generichash_final(&st, key, XPORT__AUTH_KEY);
  sodium_memzero(&st, sizeof st);
  return 0;
}

/* As ssh treats a private key: a file anyone else may read, or that
 * another user owns, is refused, since the key in it is no secret. */
int xport__auth_key_file(const char *path, uint8_t key[XPORT__AUTH_KEY])
{
  int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) {
    int e = errno;
    XPORT__WARN("XPORT_AUTH_KEY_FILE=%s: %s", path,
                e == ELOOP ? "a symbolic link: refused (name the file itself)" : strerror(e));
    return e == EACCES || e == EPERM ? -XPORT_EACCES : e == ENOENT ? -XPORT_ENOENT
                                                                  : -XPORT_EINVAL;
  }
  struct stat st;
  int ret = 0;
  if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
    XPORT__WARN("XPORT_AUTH_KEY_FILE=%s: not a regular file", path);
    ret = -XPORT_EINVAL;
  } else if (st.st_uid != geteuid()) {
    XPORT__WARN("XPORT_AUTH_KEY_FILE=%s: owned by uid %u, not by this process's user (%u): "
                "refused", path, (unsigned)st.st_uid, (unsigned)geteuid());
    ret = -XPORT_EACCES;
  } else if (st.st_mode & 077) {
    XPORT__WARN("XPORT_AUTH_KEY_FILE=%s: permissions %04o let others at it: refused "
                "(chmod 600 it)", path, (unsigned)(st.st_mode & 07777));
    ret = -XPORT_EACCES;
  } else if (st.st_size < XPORT__AUTH_KEY_MIN || st.st_size > KEY_FILE_MAX) {
    XPORT__WARN("XPORT_AUTH_KEY_FILE=%s: %lld bytes; a key has %d to %d", path,
                (long long)st.st_size, XPORT__AUTH_KEY_MIN, KEY_FILE_MAX);
    ret = -XPORT_EINVAL;
  }
  if (ret) {
    close(fd);
    return ret;
  }
  unsigned char buf[KEY_FILE_MAX];
  size_t got = 0;
  for (ssize_t r = 1; r > 0 && got < sizeof buf; got += r > 0 ? (size_t)r : 0)
    r = read(fd, buf + got, sizeof buf - got);
  close(fd);
  ret = xport__auth_key(buf, got, key);
  sodium_memzero(buf, sizeof buf);
  if (ret)
    XPORT__WARN("XPORT_AUTH_KEY_FILE=%s: could not read a key of %d bytes or more", path,
                XPORT__AUTH_KEY_MIN);
  return ret;
}

void xport__auth_draw(uint8_t key[XPORT__AUTH_KEY])
{
  crypto_auth_keygen(key);
}

void xport__auth_nonce(uint8_t nonce[XPORT__AUTH_NONCE])
{
  randombytes_buf(nonce, XPORT__AUTH_NONCE);
}

void xport__auth_mac(const uint8_t key[XPORT__AUTH_KEY], const void *msg, size_t len,
                     uint8_t mac[XPORT__AUTH_MAC])
{
  crypto_auth(mac, msg, len, key);
}

int xport__auth_same(const uint8_t a[XPORT__AUTH_MAC], const uint8_t b[XPORT__AUTH_MAC])
{
  return sodium_memcmp(a, b, XPORT__AUTH_MAC) == 0;
}

void xport__auth_wipe(void *p, size_t len)
{
  sodium_memzero(p, len);
}
