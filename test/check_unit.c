/* Provider-free units: the error table, the environment table, and the
 * argument checks that need no connection. */
#include "harness.h"

#include <string.h>

static const int codes[] = {
#define XT_CODE(name, value, msg) XPORT_##name,
  XPORT_ERRNO_MAP(XT_CODE)
#undef XT_CODE
};

START_TEST(strerror_covers_every_code)
{
  const char *unknown = xport_strerror(99999);
  for (size_t i = 0; i < sizeof codes / sizeof codes[0]; i++) {
    const char *s = xport_strerror(-codes[i]);
    ck_assert_ptr_nonnull(s);
    ck_assert_str_ne(s, unknown);
    ck_assert_str_eq(s, xport_strerror(codes[i]));
    for (size_t j = 0; j < i; j++)
      ck_assert_msg(codes[i] != codes[j], "code %d defined twice", codes[i]);
  }
  ck_assert_str_eq(xport_strerror(0), "success");
  ck_assert_ptr_nonnull(xport_strerror(-123456));
  ck_assert_int_ge(XPORT_ENOPROV, 256);
  ck_assert_int_eq(XPORT_EINVAL, EINVAL);
}
END_TEST

START_TEST(env_table_complete)
{
  static const char *names[] = {"XPORT_PROVIDER", "XPORT_DOMAIN", "XPORT_IFACE", "XPORT_LOG",
                                "XPORT_STRICT", "XPORT_PROGRESS_THREAD", "XPORT_EAGER_SIZE",
                                "XPORT_PEER_TIMEOUT", "XPORT_RMA_TIMEOUT", "XPORT_WAIT_FD",
                                "XPORT_KEEPALIVE", "XPORT_DELIVERY_COMPLETE",
                                "XPORT_LISTEN_BACKLOG", "XPORT_KEEPALIVE_TIMEOUT", "XPORT_JOB",
                                "XPORT_JOB_HOST", "XPORT_JOB_TIMEOUT", "XPORT_SHM",
                                "XPORT_FAULT", "XPORT_AUTH_KEY_FILE", "XPORT_RECV_AHEAD",
                                "XPORT_XSHM_CMA", "XPORT_OP_TIMEOUT", "XPORT_POOL_LEND"};
  const xport_env_var_t *vars = NULL;
  int n = xport_env_list(&vars);
  ck_assert_int_eq(n, (int)(sizeof names / sizeof names[0]));
  for (int i = 0; i < n; i++) {
    ck_assert_str_eq(vars[i].name, names[i]);
    ck_assert_msg(vars[i].type && vars[i].def && vars[i].help && strlen(vars[i].help) > 20,
                  "%s lacks type, default or help", vars[i].name);
  }
  ck_assert_int_eq(xport_env_list(NULL), -XPORT_EINVAL);
}
END_TEST

START_TEST(null_handles)
{
  xport_caps_t caps;
  const xport_candidate_t *cands;
  ck_assert_int_eq(xport_ctx_create(NULL, NULL), -XPORT_EINVAL);
  ck_assert_int_eq(xport_ctx_destroy(NULL), 0);
  ck_assert_int_eq(xport_ctx_query(NULL, &caps), -XPORT_EINVAL);
  ck_assert_int_eq(xport_ctx_candidates(NULL, &cands), -XPORT_EINVAL);
  ck_assert_int_eq(xport_conn_close(NULL), 0);
  ck_assert_int_eq(xport_listener_close(NULL), 0);
  ck_assert_int_eq(xport_mr_dereg(NULL), 0);
  ck_assert_int_eq(xport_accept(NULL, 0, NULL), -XPORT_EINVAL);
  ck_assert_int_eq(xport_poll(NULL, NULL, 0), -XPORT_EINVAL);
}
END_TEST

static Suite *make_suite(void)
{
  Suite *s = suite_create("unit");
  TCase *tc = tcase_create("Errors");
  tcase_add_test(tc, strerror_covers_every_code);
  tcase_add_test(tc, env_table_complete);
  tcase_add_test(tc, null_handles);
  suite_add_tcase(s, tc);
  return s;
}

int main(void)
{
  return xt_main("check_unit", make_suite, 0);
}
