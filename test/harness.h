/* Shared test harness: runs a Check suite once per provider configuration
 * present on the machine, and gives tests a two-process client/server. */
#ifndef XPORT_TEST_HARNESS_H
#define XPORT_TEST_HARNESS_H

#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <xport.h>

/* The configuration the current run is for, e.g. "tcp" or "tcp-strict". */
const char *xt_config(void);
/* The provider the test's connections run on (xport_conn_query): "shm"
 * in the configurations with shm beside a fabric. */
const char *xt_transport(void);
/* The shm name of a listener at xt_host():port (providers/shm.c). */
void xt_shm_name(const char *port, char *buf, size_t len);
/* 1 in the configurations with shm beside a fabric: xt_transport() is
 * "shm", or the fabric's where the servers run on another node
 * (shm+tcp@2nodes: a network namespace of their own). */
int xt_mixed(void);
/* A packed key holds one part per transport of its context (src/api/rma.c):
 * moves the part for conn's transport to the front of raw and returns its
 * length, for tests that forge a key's fields. */
size_t xt_key_part(xport_conn_t *conn, uint8_t *raw, size_t len);
/* Seals a packed key (len bytes) again after a test edited its fields:
 * its checksum (src/api/rma.c), as a forger would recompute it. */
void xt_key_reseal(uint8_t *k, size_t len);
/* Fails unless conn runs over xt_transport(). */
void xt_check_transport(xport_conn_t *conn);
/* The host tests listen on: 127.0.0.1, or $XPORT_TEST_HOST (verbs needs
 * an address with an RDMA device behind it); and "HOST:0". */
const char *xt_host(void);
const char *xt_listen_addr(void);

/* Runs make() per provider configuration (network suites) or once
 * (network == 0). Exits 0, 1 on failure, 77 when every config skipped. */
int xt_main(const char *prog, Suite *(*make)(void), int network);

/* In a forked server process a failed check prints and exits 1; in the
 * test process it is a Check failure. */
extern int xt_in_child;
#define XT_CHECK(cond, ...)                                                   \
  do {                                                                        \
    if (!(cond)) {                                                            \
      if (xt_in_child) {                                                      \
        fprintf(stderr, "server %s:%d: check failed: %s: ", __FILE__,         \
                __LINE__, #cond);                                             \
        fprintf(stderr, __VA_ARGS__);                                         \
        fprintf(stderr, "\n");                                                \
        _exit(1);                                                             \
      }                                                                       \
      ck_abort_msg(__VA_ARGS__);                                              \
    }                                                                         \
  } while (0)
#define XT_OK(expr)                                                           \
  do {                                                                        \
    int xt_rc_ = (expr);                                                      \
    XT_CHECK(xt_rc_ >= 0, "%s -> %d (%s)", #expr, xt_rc_,                     \
             xport_strerror(xt_rc_));                                         \
  } while (0)

/* ThreadSanitizer slows every step, libfabric's included: connections
 * over tcp;ofi_rxm took 20 s and more to be made there with another suite
 * running beside (make check-tsan). Waits for a connection, or for what
 * must come, are that much longer in such a build; natively each takes
 * well under a second. */
#if defined(__SANITIZE_THREAD__)
#define XT_SLOW 4
#else
#define XT_SLOW 1
#endif
#define XT_SETUP_MS (20000 * XT_SLOW)

/* Returns XT_CLOSED when it closed conn itself, else 0. */
#define XT_CLOSED 1
typedef int (*xt_side_fn)(xport_ctx_t *ctx, xport_conn_t *conn, void *arg);

/* Forks a server that listens on 127.0.0.1:0, accepts one connection and
 * runs server(); the test process connects and runs client(). Both ends
 * close their connection and context afterwards; the server must exit 0. */
void xt_pair(xt_side_fn server, xt_side_fn client, void *arg);

/* Forks a server that runs fn(ctx, listener-address-is-sent) itself. */
typedef void (*xt_listen_fn)(xport_ctx_t *ctx, xport_listener_t *lst, void *arg);
pid_t xt_spawn_server(xt_listen_fn fn, void *arg, char *addr, size_t len);
/* The same, listening on listen_addr instead of xt_listen_addr(). */
pid_t xt_spawn_server_on(const char *listen_addr, xt_listen_fn fn, void *arg, char *addr,
                         size_t len);
/* Waits for a spawned server and returns its exit status (or 128+signal). */
int xt_reap(pid_t pid);

/* Forks the server half of xt_pair and returns at once. */
pid_t xt_spawn_pair_server(xt_side_fn server, void *arg, char *addr, size_t len);

/* The capabilities of a context of the current configuration, as the
 * runner's probe found them (a test that needs them before it forks
 * opens no context of its own for that). */
const xport_caps_t *xt_caps(void);
/* A context (fails the test if it cannot be made); with attributes. */
xport_ctx_t *xt_ctx(void);
xport_ctx_t *xt_ctx_with(const xport_ctx_attr_t *attr);
/* fork(), with the child marked xt_in_child and killed with its parent.
 * Only before this process opened a context (xport(7), FORK): a test
 * forks every peer it needs first. */
pid_t xt_fork(void);
/* Polls (with xport_wait) until one completion arrives; 0 or -ETIMEDOUT. */
int xt_next(xport_ctx_t *ctx, xport_completion_t *c, int timeout_ms);
/* Waits for a completion of op; others that come first are kept for
 * later waits (a little control channel). */
xport_completion_t xt_wait_op(xport_ctx_t *ctx, xport_op_t op, int timeout_ms);
/* Keeps the next completion, if one comes, for xt_wait_op. */
void xt_stash_one(xport_ctx_t *ctx, int timeout_ms);

/* Pipes between the test process (client) and a forked server: steps
 * that one takes and the other waits for without calling xport. */
struct xt_steps {
  int c2s[2], s2c[2];
};
void xt_steps_open(struct xt_steps *st);
void xt_steps_close(struct xt_steps *st);
void xt_step_put(int fd, char what);
/* Removes process pid's endpoint files from /dev/shm (those an endpoint
 * left open at its context's end keeps), once no context of it lives. */
void xt_shm_remove_of(pid_t pid);
char xt_step_get(int fd, int timeout_ms);

/* Deterministic fill and check of a pattern. */
void xt_fill(void *buf, size_t len, unsigned seed);
size_t xt_verify(const void *buf, size_t len, unsigned seed); /* bad index or len */

#endif
