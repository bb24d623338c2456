/* The capability probe and the environment: each variable is honoured,
 * an explicit attribute beats it, and a failed choice explains itself.
 * These name tcp, which every libfabric build has. */
#include "harness.h"

#include <fcntl.h>
#include <string.h>
#include <unistd.h>

static void clear_env(void)
{
  unsetenv("XPORT_PROVIDER");
  unsetenv("XPORT_DOMAIN");
  unsetenv("XPORT_IFACE");
  unsetenv("XPORT_STRICT");
  unsetenv("XPORT_PROGRESS_THREAD");
  unsetenv("XPORT_SHM");
  setenv("XPORT_LOG", "none", 1);
}

static const xport_candidate_t *find(const xport_candidate_t *c, int n, const char *prov,
                                     xport_verdict_t v)
{
  for (int i = 0; i < n; i++)
    if (!strcmp(c[i].provider, prov) && (!v || c[i].verdict == v))
      return &c[i];
  return NULL;
}

START_TEST(default_ranking)
{
  xport_ctx_t *ctx;
  const xport_candidate_t *c;
  xport_caps_t caps;
  clear_env();
  ck_assert_int_eq(xport_ctx_create(NULL, &ctx), 0);
  int n = xport_ctx_candidates(ctx, &c);
  ck_assert_int_gt(n, 0);
  ck_assert_int_eq(c[0].verdict, XPORT_VERDICT_CHOSEN);
  ck_assert_int_eq(xport_ctx_query(ctx, &caps), 0);
  ck_assert_str_eq(caps.provider, c[0].provider);
  /* verbs is not on this machine; tcp is the best that remains. */
  if (!find(c, n, "verbs", 0))
    ck_assert_str_eq(caps.provider, "tcp");
  const xport_candidate_t *s = find(c, n, "sockets", 0);
  if (s) {
    ck_assert_int_eq(s->verdict, XPORT_VERDICT_REJECTED);
    ck_assert_ptr_nonnull(strstr(s->reason, "milliseconds"));
  }
  ck_assert_int_eq(caps.imm_bits, 32);
  ck_assert_int_eq(caps.ep_type, XPORT_EP_MSG);
  ck_assert_int_eq(caps.rma, XPORT_SUPPORT_NATIVE);
  ck_assert_int_eq(caps.strict, 0);
  ck_assert_int_eq(caps.progress, XPORT_PROGRESS_MANUAL);
  xport_ctx_destroy(ctx);
}
END_TEST

START_TEST(provider_named_explicitly)
{
  xport_ctx_t *ctx;
  xport_caps_t caps;
  clear_env();
  setenv("XPORT_PROVIDER", "sockets", 1);
  ck_assert_int_eq(xport_ctx_create(NULL, &ctx), 0);
  ck_assert_int_eq(xport_ctx_query(ctx, &caps), 0);
  ck_assert_str_eq(caps.provider, "sockets");
  xport_ctx_destroy(ctx);
}
END_TEST

START_TEST(provider_absent)
{
  xport_ctx_t *ctx = (xport_ctx_t *)0x1;
  char log[4096] = "";
  int p[2];
  clear_env();
  setenv("XPORT_PROVIDER", "nosuchprov", 1);
  setenv("XPORT_LOG", "error", 1);
  ck_assert_int_eq(pipe(p), 0);
  int saved = dup(2);
  dup2(p[1], 2);
  int rc = xport_ctx_create(NULL, &ctx);
  dup2(saved, 2);
  close(p[1]);
  ssize_t n = read(p[0], log, sizeof log - 1);
  close(p[0]);
  ck_assert_int_eq(rc, -XPORT_ENOPROV);
  ck_assert_ptr_eq(ctx, (xport_ctx_t *)0x1);
  ck_assert_int_gt(n, 0);
  ck_assert_msg(strstr(log, "nosuchprov") && strstr(log, "found:") && strstr(log, "tcp"),
                "message does not list what was found: %s", log);
}
END_TEST

START_TEST(provider_excluded)
{
  xport_ctx_t *ctx = NULL;
  xport_ctx_attr_t attr = {.provider = "^tcp"};
  clear_env();
  int rc = xport_ctx_create(&attr, &ctx);
  if (rc == 0) {
    const xport_candidate_t *c;
    int n = xport_ctx_candidates(ctx, &c);
    xport_caps_t caps;
    xport_ctx_query(ctx, &caps);
    ck_assert_str_ne(caps.provider, "tcp");
    const xport_candidate_t *t = find(c, n, "tcp", 0);
    ck_assert_ptr_nonnull(t);
    ck_assert_int_eq(t->verdict, XPORT_VERDICT_REJECTED);
    ck_assert_ptr_nonnull(strstr(t->reason, "excluded"));
    xport_ctx_destroy(ctx);
  } else {
    ck_assert_int_eq(rc, -XPORT_ENOPROV);
  }
}
END_TEST

START_TEST(attribute_beats_environment)
{
  xport_ctx_t *ctx;
  xport_caps_t caps;
  xport_ctx_attr_t attr = {.provider = "tcp", .strict = XPORT_OFF};
  clear_env();
  setenv("XPORT_PROVIDER", "nosuchprov", 1);
  setenv("XPORT_STRICT", "1", 1);
  ck_assert_int_eq(xport_ctx_create(&attr, &ctx), 0);
  ck_assert_int_eq(xport_ctx_query(ctx, &caps), 0);
  ck_assert_str_eq(caps.provider, "tcp");
  ck_assert_int_eq(caps.strict, 0);
  xport_ctx_destroy(ctx);
}
END_TEST

START_TEST(domain_and_iface)
{
  xport_ctx_t *ctx = NULL;
  xport_caps_t caps;
  const xport_candidate_t *c;
  clear_env();
  setenv("XPORT_PROVIDER", "tcp", 1);
  setenv("XPORT_DOMAIN", "lo", 1);
  ck_assert_int_eq(xport_ctx_create(NULL, &ctx), 0);
  xport_ctx_query(ctx, &caps);
  ck_assert_str_eq(caps.domain, "lo");
  xport_ctx_destroy(ctx);

  setenv("XPORT_DOMAIN", "nosuchdev0", 1);
  ck_assert_int_eq(xport_ctx_create(NULL, &ctx), -XPORT_ENOPROV);
  unsetenv("XPORT_DOMAIN");

  /* Nothing named, an interface that matches nothing: no context, not
   * one on shm, which reaches this node only. */
  unsetenv("XPORT_PROVIDER");
  setenv("XPORT_IFACE", "nosuchif9", 1);
  ctx = (xport_ctx_t *)0x1;
  ck_assert_int_eq(xport_ctx_create(NULL, &ctx), -XPORT_ENOPROV);
  ck_assert_ptr_eq(ctx, (xport_ctx_t *)0x1);
  unsetenv("XPORT_IFACE");
  setenv("XPORT_PROVIDER", "tcp", 1);

  setenv("XPORT_IFACE", "lo", 1);
  ck_assert_int_eq(xport_ctx_create(NULL, &ctx), 0);
  xport_ctx_query(ctx, &caps);
  ck_assert_str_eq(caps.domain, "lo");
  int n = xport_ctx_candidates(ctx, &c);
  for (int i = 0; i < n; i++)
    if (c[i].verdict == XPORT_VERDICT_REJECTED && !strcmp(c[i].provider, "tcp"))
      ck_assert_msg(strstr(c[i].reason, "XPORT_IFACE"), "reason: %s", c[i].reason);
  xport_ctx_destroy(ctx);

  setenv("XPORT_IFACE", "nosuchif9", 1);
  ck_assert_int_eq(xport_ctx_create(NULL, &ctx), -XPORT_ENOPROV);
}
END_TEST

/* Reads what xport_ctx_create writes on stderr into log. */
static int create_logged(xport_ctx_t **ctx_p, char *log, size_t len)
{
  int p[2];
  ck_assert_int_eq(pipe(p), 0);
  int saved = dup(2);
  dup2(p[1], 2);
  int rc = xport_ctx_create(NULL, ctx_p);
  dup2(saved, 2);
  close(saved);
  close(p[1]);
  ssize_t n = read(p[0], log, len - 1);
  close(p[0]);
  log[n > 0 ? n : 0] = '\0';
  return rc;
}

/* rxm lets a local process of any user take a connection over (xport(7),
 * SECURITY): the probe never picks it unasked, even where nothing else is
 * left, and a context opened on it by name says so, once per process. */
START_TEST(rxm_only_when_named)
{
  xport_ctx_t *ctx = (xport_ctx_t *)0x1;
  char log[4096];
  clear_env();
  setenv("XPORT_LOG", "warn", 1);
  setenv("XPORT_PROVIDER", "tcp;ofi_rxm", 1);
  if (create_logged(&ctx, log, sizeof log) != 0) {
    printf("SKIP: rxm_only_when_named: tcp;ofi_rxm does not open here\n");
    return;
  }
  ck_assert_msg(strstr(log, "take over") && strstr(log, "SECURITY"),
                "a context on tcp;ofi_rxm said nothing of takeovers: '%s'", log);
  xport_ctx_t *second;
  ck_assert_int_eq(create_logged(&second, log, sizeof log), 0);
  ck_assert_msg(!strstr(log, "take over"), "told twice: '%s'", log);
  xport_ctx_destroy(second);
  xport_ctx_destroy(ctx);

  /* Everything else excluded: rxm is what is left, and is not taken. */
  setenv("XPORT_PROVIDER", "^tcp,shm,verbs", 1);
  setenv("XPORT_SHM", "off", 1);
  ctx = (xport_ctx_t *)0x1;
  int rc = create_logged(&ctx, log, sizeof log);
  if (rc == 0) {
    xport_caps_t caps;
    ck_assert_int_eq(xport_ctx_query(ctx, &caps), 0);
    ck_assert_msg(!strstr(caps.provider, "rxm"), "chose %s unasked", caps.provider);
    xport_ctx_destroy(ctx);
    return;
  }
  ck_assert_int_eq(rc, -XPORT_ENOPROV);
  ck_assert_ptr_eq(ctx, (xport_ctx_t *)0x1);
}
END_TEST

/* A job script sets XPORT_IFACE for all its runs; one that names shm,
 * which has no network interface, still gets it. */
START_TEST(iface_spares_node_local)
{
  xport_ctx_t *ctx = NULL;
  xport_caps_t caps;
  char log[4096];
  clear_env();
  setenv("XPORT_PROVIDER", "shm", 1);
  setenv("XPORT_LOG", "error", 1);
  if (create_logged(&ctx, log, sizeof log) == -XPORT_ENOPROV) {
    printf("SKIP: iface_spares_node_local on %s: shm does not open here\n", xt_config());
    return;
  }
  xport_ctx_destroy(ctx);
  const char *ifaces[] = {"lo", "nosuchif9"};
  for (size_t i = 0; i < 2; i++) {
    setenv("XPORT_IFACE", ifaces[i], 1);
    int rc = create_logged(&ctx, log, sizeof log);
    ck_assert_msg(rc == 0, "XPORT_IFACE=%s: %s: %s", ifaces[i], xport_strerror(rc), log);
    xport_ctx_query(ctx, &caps);
    ck_assert_str_eq(caps.provider, "shm");
    xport_ctx_destroy(ctx);
  }
}
END_TEST

/* A probe that finds nothing says why the provider asked for was turned
 * down, not only which providers exist. */
START_TEST(failure_says_why)
{
  xport_ctx_t *ctx = (xport_ctx_t *)0x1;
  char log[4096];
  clear_env();
  setenv("XPORT_PROVIDER", "tcp", 1);
  setenv("XPORT_IFACE", "nosuchif9", 1);
  setenv("XPORT_LOG", "error", 1);
  ck_assert_int_eq(create_logged(&ctx, log, sizeof log), -XPORT_ENOPROV);
  ck_assert_ptr_eq(ctx, (xport_ctx_t *)0x1);
  ck_assert_msg(strstr(log, "tcp: not on interface XPORT_IFACE=nosuchif9"),
                "no reason given: %s", log);
  ck_assert_msg(strstr(log, "xport_info"), "no pointer to the full table: %s", log);
  /* The providers not asked for are not listed as reasons. */
  ck_assert_msg(!strstr(log, "not requested"), "noise: %s", log);
}
END_TEST

START_TEST(strict_and_progress_thread)
{
  xport_ctx_t *ctx;
  xport_caps_t caps;
  clear_env();
  setenv("XPORT_PROVIDER", "tcp", 1);
  setenv("XPORT_STRICT", "1", 1);
  setenv("XPORT_PROGRESS_THREAD", "yes", 1);
  ck_assert_int_eq(xport_ctx_create(NULL, &ctx), 0);
  xport_ctx_query(ctx, &caps);
  ck_assert_int_eq(caps.strict, 1);
  ck_assert_int_eq(caps.progress_thread, 1);
  ck_assert_uint_eq(caps.mr_mode & (XPORT_MR_LOCAL | XPORT_MR_VIRT_ADDR | XPORT_MR_PROV_KEY),
                    XPORT_MR_LOCAL | XPORT_MR_VIRT_ADDR | XPORT_MR_PROV_KEY);
  xport_ctx_destroy(ctx);
  setenv("XPORT_STRICT", "banana", 1); /* malformed: warning, default */
  ck_assert_int_eq(xport_ctx_create(NULL, &ctx), 0);
  xport_ctx_query(ctx, &caps);
  ck_assert_int_eq(caps.strict, 0);
  xport_ctx_destroy(ctx);
}
END_TEST

/* A context of the environment's settings has no descriptor: the fd is
 * refused, the output untouched, and waiting still works (in steps). */
static void expect_no_fd(void)
{
  xport_ctx_t *ctx;
  xport_caps_t caps;
  int fd = -7;
  ck_assert_int_eq(xport_ctx_create(NULL, &ctx), 0);
  xport_ctx_query(ctx, &caps);
  ck_assert_int_eq(caps.wait_fd, 0);
  ck_assert_int_eq(xport_ctx_fd(ctx, &fd), -XPORT_ENOSYS);
  ck_assert_int_eq(fd, -7);
  ck_assert_int_eq(xport_wait(ctx, 10), -XPORT_ETIMEDOUT);
  xport_ctx_destroy(ctx);
}

START_TEST(wait_fd_usable)
{
  xport_ctx_t *ctx;
  xport_caps_t caps;
  int fd = -1;
  clear_env();
  setenv("XPORT_PROVIDER", "tcp", 1);
  setenv("XPORT_SHM", "off", 1); /* the fabric alone */
  ck_assert_int_eq(xport_ctx_create(NULL, &ctx), 0);
  xport_ctx_query(ctx, &caps);
  ck_assert_int_eq(caps.wait_fd, 1);
  ck_assert_int_eq(xport_ctx_fd(ctx, &fd), 0);
  ck_assert_int_ge(fcntl(fd, F_GETFD), 0);
  ck_assert_int_eq(xport_wait(ctx, 10), -XPORT_ETIMEDOUT);
  xport_ctx_destroy(ctx);
  /* shm beside tcp: the descriptor covers both (shm's lane by a timer). */
  setenv("XPORT_SHM", "auto", 1);
  ck_assert_int_eq(xport_ctx_create(NULL, &ctx), 0);
  xport_ctx_query(ctx, &caps);
  ck_assert_int_eq(caps.wait_fd, 1);
  fd = -1;
  ck_assert_int_eq(xport_ctx_fd(ctx, &fd), 0);
  ck_assert_int_ge(fcntl(fd, F_GETFD), 0);
  ck_assert_int_eq(xport_wait(ctx, 10), -XPORT_ETIMEDOUT);
  xport_ctx_destroy(ctx);
  setenv("XPORT_SHM", "off", 1);
  /* Opened without one. */
  setenv("XPORT_WAIT_FD", "0", 1);
  expect_no_fd();
  unsetenv("XPORT_WAIT_FD");
}
END_TEST

static Suite *make_suite(void)
{
  Suite *s = suite_create("probe");
  TCase *tc = tcase_create("Core");
  tcase_set_timeout(tc, 30);
  tcase_add_test(tc, default_ranking);
  tcase_add_test(tc, provider_named_explicitly);
  tcase_add_test(tc, provider_absent);
  tcase_add_test(tc, provider_excluded);
  tcase_add_test(tc, attribute_beats_environment);
  tcase_add_test(tc, domain_and_iface);
  tcase_add_test(tc, iface_spares_node_local);
  tcase_add_test(tc, rxm_only_when_named);
  tcase_add_test(tc, failure_says_why);
  tcase_add_test(tc, strict_and_progress_thread);
  tcase_add_test(tc, wait_fd_usable);
  suite_add_tcase(s, tc);
  return s;
}

int main(void)
{
  return xt_main("check_probe", make_suite, 0);
}
