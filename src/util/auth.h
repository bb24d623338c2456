/* Keys, nonces and MACs of the context key (util/auth.c, libsodium). */
#ifndef XPORT_UTIL_AUTH_H
#define XPORT_UTIL_AUTH_H

#include "base.h"

/* auth.c: the shared key connections prove (xport(7), AUTHENTICATION),
 * and libsodium's keyed MAC and nonces for the transports' handshakes. */
#define XPORT__AUTH_KEY 32     /* the MAC key a context holds */
#define XPORT__AUTH_KEY_MIN 16 /* the least key a caller may give */
#define XPORT__AUTH_NONCE 32
#define XPORT__AUTH_MAC 32
int xport__auth_init(void);
/* The MAC key made of a caller's key bytes (at least AUTH_KEY_MIN). */
int xport__auth_key(const void *raw, size_t len, uint8_t key[XPORT__AUTH_KEY]);
/* The MAC key in the file at path, refused (logged, never its content)
 * unless a regular file of this user that nobody else may read. */
int xport__auth_key_file(const char *path, uint8_t key[XPORT__AUTH_KEY]);
void xport__auth_nonce(uint8_t nonce[XPORT__AUTH_NONCE]);
void xport__auth_draw(uint8_t key[XPORT__AUTH_KEY]); /* a fresh random key */
void xport__auth_mac(const uint8_t key[XPORT__AUTH_KEY], const void *msg, size_t len,
                     uint8_t mac[XPORT__AUTH_MAC]);
/* 1 if two proofs are equal, in time that does not depend on where they differ. */
int xport__auth_same(const uint8_t a[XPORT__AUTH_MAC], const uint8_t b[XPORT__AUTH_MAC]);
void xport__auth_wipe(void *p, size_t len);

#endif /* XPORT_UTIL_AUTH_H */
