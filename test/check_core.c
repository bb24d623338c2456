/* Provider-free tests of the core's ordering logic, driven by a fake
 * transport: its "provider" completes what was posted when and how the
 * test says (out of order, failed, after a close), so that what the user
 * then sees from xport_poll is checked against the rules xport(7) states,
 * with no second process and no provider's timing in the way. Built from
 * the library's sources (its internals are hidden in libxport.so). */
#include "../src/xport_int.h"
#include "harness.h"

#include <stdio.h>
#include <string.h>

/* ---- the fake provider's completion queue ------------------------------ */

#define FQ 256
static struct fake_ent {
  struct fi_cq_data_entry e;
  int err; /* a libfabric error code (positive), or 0 */
} fq[FQ];
static unsigned fq_head, fq_tail;

/* What the fake transport was given, in the order it was given. */
static struct xport__req *posted[FQ];
static unsigned nposted_fake;
static int push_back; /* posts answer -FI_EAGAIN while set */

static ssize_t fcq_read(struct fid_cq *cq, void *buf, size_t count)
{
  (void)cq;
  struct fi_cq_data_entry *out = buf;
  size_t n = 0;
  while (n < count && fq_head != fq_tail && !fq[fq_head % FQ].err)
    out[n++] = fq[fq_head++ % FQ].e;
  if (n)
    return (ssize_t)n;
  return fq_head != fq_tail ? -FI_EAVAIL : -FI_EAGAIN;
}

static ssize_t fcq_readfrom(struct fid_cq *cq, void *buf, size_t count, fi_addr_t *src)
{
  (void)src;
  return fcq_read(cq, buf, count);
}

static ssize_t fcq_readerr(struct fid_cq *cq, struct fi_cq_err_entry *buf, uint64_t flags)
{
  (void)cq, (void)flags;
  if (fq_head == fq_tail || !fq[fq_head % FQ].err)
    return -FI_EAGAIN;
  struct fake_ent *f = &fq[fq_head++ % FQ];
  memset(buf, 0, sizeof *buf);
  buf->op_context = f->e.op_context;
  buf->flags = f->e.flags;
  buf->len = f->e.len;
  buf->err = f->err;
  buf->prov_errno = f->err;
  return 1;
}

static ssize_t fcq_sread(struct fid_cq *cq, void *buf, size_t count, const void *cond, int timeout)
{
  (void)cq, (void)buf, (void)count, (void)cond, (void)timeout;
  return -FI_ENOSYS;
}

static ssize_t fcq_sreadfrom(struct fid_cq *cq, void *buf, size_t count, fi_addr_t *src,
                             const void *cond, int timeout)
{
  (void)src;
  return fcq_sread(cq, buf, count, cond, timeout);
}

static int fcq_signal(struct fid_cq *cq)
{
  (void)cq;
  return 0;
}

static const char *fcq_strerror(struct fid_cq *cq, int prov_errno, const void *err_data,
                                char *buf, size_t len)
{
  (void)cq, (void)err_data;
  snprintf(buf, len, "fake provider error %d", prov_errno);
  return buf;
}

static int fcq_close(struct fid *fid)
{
  (void)fid;
  return 0;
}

static int fcq_control(struct fid *fid, int command, void *arg)
{
  (void)fid, (void)command, (void)arg;
  return -FI_ENOSYS;
}

static struct fi_ops fcq_fid_ops = {.size = sizeof(struct fi_ops), .close = fcq_close,
                                    .control = fcq_control};
static struct fi_ops_cq fcq_ops = {.size = sizeof(struct fi_ops_cq),
                                   .read = fcq_read,
                                   .readfrom = fcq_readfrom,
                                   .readerr = fcq_readerr,
                                   .sread = fcq_sread,
                                   .sreadfrom = fcq_sreadfrom,
                                   .signal = fcq_signal,
                                   .strerror = fcq_strerror};
static struct fid_cq fake_cq = {.fid = {.fclass = FI_CLASS_CQ, .ops = &fcq_fid_ops},
                                .ops = &fcq_ops};

/* The provider finishes req: len bytes, or the error err (FI_E*). */
static void provider_done(struct xport__req *req, size_t len, int err)
{
  ck_assert_uint_lt(fq_tail - fq_head, FQ);
  struct fake_ent *f = &fq[fq_tail++ % FQ];
  memset(f, 0, sizeof *f);
  f->e.op_context = &req->fictx;
  f->e.len = len;
  f->e.flags = req->op == XPORT_OP_RECV ? FI_RECV | FI_MSG : FI_SEND | FI_MSG;
  f->err = err;
}

/* ---- the fake transport -------------------------------------------------- */

static ssize_t take(struct xport__req *req)
{
  if (push_back)
    return -FI_EAGAIN;
  ck_assert_uint_lt(nposted_fake, FQ);
  posted[nposted_fake++] = req;
  return 0;
}

static ssize_t f_send(xport_conn_t *conn, struct xport__req *req, struct iovec *iov,
                      void **desc, size_t cnt, uint64_t flags, uint64_t data)
{
  (void)conn, (void)iov, (void)desc, (void)cnt, (void)flags, (void)data;
  return take(req);
}

static ssize_t f_inject(xport_conn_t *conn, const void *buf, size_t len, int with_imm,
                        uint32_t imm)
{
  (void)conn, (void)buf, (void)len, (void)with_imm, (void)imm;
  return -FI_ENOSYS; /* every send leaves a request behind */
}

static ssize_t f_recv(xport_conn_t *conn, struct xport__req *req, struct iovec *iov,
                      void **desc, size_t cnt)
{
  (void)conn, (void)iov, (void)desc, (void)cnt;
  return take(req);
}

static ssize_t f_marker(xport_conn_t *conn, struct xport__req *req, uint64_t flags)
{
  (void)conn, (void)req, (void)flags;
  return -FI_ENOSYS;
}

static int f_is_marker(const struct fi_cq_data_entry *e)
{
  (void)e;
  return 0;
}

static ssize_t f_read(xport_conn_t *conn, struct xport__req *req, struct iovec *iov,
                      void **desc, size_t cnt, uint64_t addr, uint64_t key)
{
  (void)conn, (void)iov, (void)desc, (void)cnt, (void)addr, (void)key;
  return take(req);
}

static ssize_t f_write(xport_conn_t *conn, struct xport__req *req, struct iovec *iov,
                       void **desc, size_t cnt, uint64_t addr, uint64_t key, uint64_t flags,
                       uint64_t data)
{
  (void)conn, (void)iov, (void)desc, (void)cnt, (void)addr, (void)key, (void)flags,
      (void)data;
  return take(req);
}

static ssize_t f_atomic(xport_conn_t *conn, struct xport__req *req, unsigned kind, uint64_t *v,
                        void *desc, uint64_t addr, uint64_t key)
{
  (void)conn, (void)req, (void)kind, (void)v, (void)desc, (void)addr, (void)key;
  return -FI_ENOSYS;
}

static const struct xport__data_ops fake_data = {
    .send = f_send,
    .inject = f_inject,
    .recv = f_recv,
    .marker = f_marker,
    .is_marker = f_is_marker,
    .read = f_read,
    .write = f_write,
    .atomic = f_atomic,
};

static int f_describe(struct fi_info **info_p)
{
  struct fi_info *fi = fi_allocinfo();
  if (!fi)
    return -XPORT_ENOMEM;
  fi->caps = FI_MSG | FI_RMA;
  fi->ep_attr->type = FI_EP_MSG;
  fi->ep_attr->max_msg_size = 1 << 20;
  fi->tx_attr->size = fi->rx_attr->size = 16;
  fi->tx_attr->iov_limit = fi->rx_attr->iov_limit = 4;
  fi->tx_attr->inject_size = 64;
  fi->domain_attr->cq_data_size = 4;
  fi->domain_attr->name = strdup("fake");
  fi->fabric_attr->name = strdup("fake");
  fi->fabric_attr->prov_name = strdup("fake");
  *info_p = fi;
  return 0;
}

static int f_open(struct xport__lane *lane)
{
  lane->cq = &fake_cq;
  lane->max_posted = 128;
  return 0;
}

static int f_connect(struct xport__lane *lane, const char *host, const char *port,
                     const struct xport__conn_data *data, long deadline, xport_conn_t **conn_p)
{
  (void)host, (void)port, (void)data, (void)deadline;
  xport_conn_t *conn = xport__conn_new(lane);
  if (!conn)
    return -XPORT_ENOMEM;
  conn->ops = &fake_data;
  conn->state = XPORT__CONN_CONNECTED;
  xport__conn_link(conn);
  *conn_p = conn;
  return 0;
}

/* As the RDM transport closes: what is out stays the provider's until it
 * reports it; xport may show it only then. */
static void f_close(xport_conn_t *conn)
{
  while (conn->out)
    xport__req_orphan(conn->out, -XPORT_ECANCELED);
}

/* The provider reports the connection lost, and the transport does what
 * the RDM one does: every operation out is orphaned (the provider gives it
 * back later), then the event is queued. */
static void f_lose(xport_conn_t *conn)
{
  conn->state = XPORT__CONN_DISCONNECTED;
  while (conn->out)
    xport__req_orphan(conn->out, -XPORT_ECONNRESET);
  xport__evq_push(conn->ctx, conn, -XPORT_ECONNRESET);
}

static void f_progress(struct xport__lane *lane)
{
  (void)lane;
}

static void f_op_failed(struct xport__lane *lane, struct xport__req *req, int status)
{
  (void)lane, (void)req, (void)status;
}

static void f_drop(xport_conn_t *conn, int status)
{
  (void)status;
  f_lose(conn);
}

static const struct xport__transport fake_transport = {
    .name = "fake",
    .ep_type = FI_EP_MSG,
    .describe = f_describe,
    .open = f_open,
    .connect = f_connect,
    .close_conn = f_close,
    .progress = f_progress,
    .op_failed = f_op_failed,
    .drop = f_drop,
    .data = &fake_data,
};

/* ---- the tests ------------------------------------------------------------ */

static xport_ctx_t *ctx;
static xport_conn_t *conn;

static void setup(void)
{
  fq_head = fq_tail = 0;
  nposted_fake = 0;
  push_back = 0;
  /* The test plays the provider from its own thread, without the
   * context's lock: no progress thread reads the fake CQ meanwhile (the
   * TSan run turns it on everywhere else). */
  xport_ctx_attr_t attr = {.progress_thread = XPORT_OFF};
  ck_assert_int_eq(xport__ctx_create_on(&fake_transport, &attr, &ctx), 0);
  ck_assert_int_eq(xport_connect(ctx, "fake:1", 0, &conn), 0);
}

static void teardown(void)
{
  if (ctx)
    ck_assert_int_eq(xport_ctx_destroy(ctx), 0);
  ctx = NULL;
}

/* Polls until n completions came (a bounded number of tries: the fake
 * provider has reported everything already). */
static int poll_n(xport_completion_t *c, int n)
{
  int got = 0;
  for (int tries = 0; tries < 1000 && got < n; tries++) {
    int r = xport_poll(ctx, c + got, n - got);
    ck_assert_int_ge(r, 0);
    got += r;
  }
  return got;
}

/* Nothing more for the user: a few hundred polls find nothing. */
static void poll_none(void)
{
  xport_completion_t c;
  for (int i = 0; i < 300; i++)
    ck_assert_msg(xport_poll(ctx, &c, 1) == 0, "an unexpected completion: op %d status %d",
                  c.op, c.status);
}

START_TEST(completions_in_the_providers_order)
{
  char buf[3][16];
  for (int i = 0; i < 3; i++)
    ck_assert_int_eq(xport_recv(conn, buf[i], sizeof buf[i], NULL, buf[i]), 0);
  ck_assert_int_eq(xport_send(conn, "hello", 5, NULL, (void *)"s"), 0);
  ck_assert_uint_eq(nposted_fake, 4);
  /* The provider finishes them in its own order: the send, the third
   * receive (a message of 7 bytes), then the first. */
  provider_done(posted[3], 5, 0);
  provider_done(posted[2], 7, 0);
  provider_done(posted[0], 2, 0);
  xport_completion_t c[4];
  ck_assert_int_eq(poll_n(c, 3), 3);
  ck_assert_int_eq(c[0].op, XPORT_OP_SEND);
  ck_assert_str_eq(c[0].user_ctx, "s");
  ck_assert(c[1].op == XPORT_OP_RECV && c[1].user_ctx == buf[2] && c[1].len == 7);
  ck_assert(c[2].op == XPORT_OP_RECV && c[2].user_ctx == buf[0] && c[2].len == 2);
  for (int i = 0; i < 3; i++)
    ck_assert_int_eq(c[i].status, 0);
  poll_none();
  ck_assert_uint_eq(conn->nreqs, 1); /* the second receive, still out */
}
END_TEST

START_TEST(a_message_longer_than_its_receive_is_truncated)
{
  char buf[8];
  ck_assert_int_eq(xport_recv(conn, buf, sizeof buf, NULL, NULL), 0);
  provider_done(posted[0], 8, FI_ETRUNC);
  xport_completion_t c;
  ck_assert_int_eq(poll_n(&c, 1), 1);
  ck_assert_int_eq(c.status, -XPORT_ETRUNC);
  ck_assert_uint_eq(c.len, sizeof buf); /* what it filled */
}
END_TEST

/* A signaled send completes only after every unsignaled send before it:
 * a failure among them is seen first, then the send that came after. */
START_TEST(unsignaled_sends_vouch_in_order)
{
  ck_assert_int_eq(xport_send_flags(conn, "a", 1, NULL, XPORT_SEND_UNSIGNALED, (void *)"u1"), 0);
  ck_assert_int_eq(xport_send_flags(conn, "b", 1, NULL, XPORT_SEND_UNSIGNALED, (void *)"u2"), 0);
  ck_assert_int_eq(xport_send(conn, "c", 1, NULL, (void *)"s3"), 0);
  ck_assert_uint_eq(nposted_fake, 3);
  provider_done(posted[2], 1, 0); /* the signaled one, first */
  poll_none();                    /* it waits for those before it */
  provider_done(posted[0], 1, 0); /* u1 went: never shown */
  poll_none();
  provider_done(posted[1], 0, FI_EIO); /* u2 failed */
  xport_completion_t c[2];
  ck_assert_int_eq(poll_n(c, 2), 2);
  ck_assert(c[0].op == XPORT_OP_SEND && c[0].status == -XPORT_EIO);
  ck_assert_str_eq(c[0].user_ctx, "u2");
  /* One that came after vouches for u2: it ends with u2's error, though
   * the provider finished it (xport_send(3)). */
  ck_assert(c[1].op == XPORT_OP_SEND && c[1].status == -XPORT_EIO);
  ck_assert_str_eq(c[1].user_ctx, "s3");
  poll_none();
  ck_assert_uint_eq(conn->nreqs, 0);
}
END_TEST

/* A lost connection's receives end before its disconnect event, though
 * the transport heard of the loss first: the event waits until the
 * provider has given them back. */
START_TEST(the_disconnect_comes_after_the_operations)
{
  char buf[2][8];
  ck_assert_int_eq(xport_recv(conn, buf[0], 8, NULL, buf[0]), 0);
  ck_assert_int_eq(xport_recv(conn, buf[1], 8, NULL, buf[1]), 0);
  struct xport__lane *lane = conn->lane;
  f_lose(conn);
  poll_none(); /* the provider still holds both buffers */
  provider_done(posted[0], 0, FI_ECANCELED);
  provider_done(posted[1], 0, FI_ECANCELED);
  xport_completion_t c[3];
  ck_assert_int_eq(poll_n(c, 3), 3);
  ck_assert_msg(c[0].op == XPORT_OP_RECV && c[0].status == -XPORT_ECONNRESET, "op %d status %d",
                c[0].op, c[0].status);
  ck_assert(c[0].user_ctx == buf[0] && c[1].user_ctx == buf[1]);
  ck_assert(c[1].op == XPORT_OP_RECV && c[1].status == -XPORT_ECONNRESET);
  ck_assert_int_eq(c[2].op, XPORT_OP_DISCONNECT);
  ck_assert(c[2].conn == conn && c[2].status == -XPORT_ECONNRESET);
  poll_none();
  ck_assert_uint_eq(lane->nposted, 0);
  ck_assert_ptr_null(lane->zombies);
  /* Posting to it now is refused, with nothing posted. */
  ck_assert_int_eq(xport_recv(conn, buf[0], 8, NULL, NULL), -XPORT_ENOTCONN);
  ck_assert_uint_eq(nposted_fake, 2);
}
END_TEST

/* A closed connection's operations are shown once the provider lets go of
 * their buffers, never before, with ECANCELED; then nothing is left. */
START_TEST(a_close_waits_for_the_provider)
{
  static char buf[16];
  ck_assert_int_eq(xport_recv(conn, buf, sizeof buf, NULL, buf), 0);
  ck_assert_int_eq(xport_send(conn, "x", 1, NULL, (void *)"s"), 0);
  struct xport__lane *lane = conn->lane;
  struct xport__req *r = posted[0], *s = posted[1];
  ck_assert_int_eq(xport_conn_close(conn), 0);
  poll_none(); /* the provider still owns both */
  provider_done(r, 0, FI_ECANCELED);
  xport_completion_t c;
  ck_assert_int_eq(poll_n(&c, 1), 1);
  ck_assert(c.op == XPORT_OP_RECV && c.status == -XPORT_ECANCELED && c.user_ctx == buf);
  poll_none();
  ck_assert_uint_eq(lane->nposted, 1);
  provider_done(s, 1, 0); /* it went before the close reached it */
  ck_assert_int_eq(poll_n(&c, 1), 1);
  ck_assert_int_eq(c.op, XPORT_OP_SEND);
  ck_assert_str_eq(c.user_ctx, "s");
  poll_none();
  ck_assert_uint_eq(lane->nposted, 0);
  ck_assert_ptr_null(lane->zombies);
}
END_TEST

/* A send the provider pushes back is kept and posted again by a later
 * poll, and the sends after it wait behind it, so that messages stay in
 * order; a receive pushed back is EAGAIN with nothing posted or counted. */
START_TEST(pushed_back_sends_keep_their_order)
{
  char buf[4];
  push_back = 1;
  ck_assert_int_eq(xport_recv(conn, buf, sizeof buf, NULL, NULL), -XPORT_EAGAIN);
  ck_assert_uint_eq(conn->nreqs, 0);
  ck_assert_int_eq(xport_send(conn, "A", 1, NULL, (void *)"A"), 0);
  push_back = 0;
  ck_assert_int_eq(xport_send(conn, "B", 1, NULL, (void *)"B"), 0);
  ck_assert_uint_eq(nposted_fake, 0); /* B waits behind A */
  ck_assert_int_eq(xport_recv(conn, buf, sizeof buf, NULL, (void *)"R"), 0);
  ck_assert_uint_eq(nposted_fake, 1); /* receives do not */
  xport_completion_t c[3];
  ck_assert_int_eq(xport_poll(ctx, c, 3), 0);
  ck_assert_uint_eq(nposted_fake, 3); /* the poll posted both, in order */
  ck_assert_str_eq(posted[1]->user_ctx, "A");
  ck_assert_str_eq(posted[2]->user_ctx, "B");
  provider_done(posted[1], 1, 0);
  provider_done(posted[2], 1, 0);
  provider_done(posted[0], 1, 0);
  ck_assert_int_eq(poll_n(c, 3), 3);
  ck_assert_str_eq(c[0].user_ctx, "A");
  ck_assert_str_eq(c[1].user_ctx, "B");
  ck_assert_str_eq(c[2].user_ctx, "R");
  poll_none();
  ck_assert_uint_eq(conn->nreqs, 0);
}
END_TEST

/* The depth the transport describes is what a connection may have out:
 * one more is EAGAIN, and a completion makes room again. */
START_TEST(the_depth_is_kept)
{
  static char buf[17][4];
  int i;
  for (i = 0; i < 16; i++)
    ck_assert_int_eq(xport_recv(conn, buf[i], 4, NULL, NULL), 0);
  ck_assert_int_eq(xport_recv(conn, buf[16], 4, NULL, NULL), -XPORT_EAGAIN);
  ck_assert_uint_eq(nposted_fake, 16);
  provider_done(posted[5], 4, 0);
  xport_completion_t c;
  ck_assert_int_eq(poll_n(&c, 1), 1);
  ck_assert_int_eq(xport_recv(conn, buf[16], 4, NULL, NULL), 0);
}
END_TEST

static Suite *make_suite(void)
{
  Suite *s = suite_create("core");
  TCase *tc = tcase_create("Ordering");
  tcase_add_checked_fixture(tc, setup, teardown);
  tcase_add_test(tc, completions_in_the_providers_order);
  tcase_add_test(tc, a_message_longer_than_its_receive_is_truncated);
  tcase_add_test(tc, unsignaled_sends_vouch_in_order);
  tcase_add_test(tc, the_disconnect_comes_after_the_operations);
  tcase_add_test(tc, a_close_waits_for_the_provider);
  tcase_add_test(tc, pushed_back_sends_keep_their_order);
  tcase_add_test(tc, the_depth_is_kept);
  suite_add_tcase(s, tc);
  return s;
}

int main(void)
{
  return xt_main("check_core", make_suite, 0);
}
