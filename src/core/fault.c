/* Fault injection (XPORT_FAULT), for applications' own tests and xport's:
 * a registration that fails, connections lost after so many posts,
 * completions held back, posts pushed back. Read once, when a context is
 * created; off, it costs the data path one test of ctx->fault.
 *
 * Each fault goes the way the real one goes: an injected push-back is
 * the one a full queue gives (nothing posted, nothing kept, the caller
 * posts again), a dropped connection is lost through its transport's own
 * loss path (lane->tp->drop), and a held completion is one xport_poll has
 * not found yet. Grammar, documented in xport_env(7):
 *   XPORT_FAULT=RULE[,RULE]...   RULE: mr_reg:N | drop_conn:N | delay_ms:N | eagain:N
 */
#include "xport_int.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FAULT_COUNT_MAX 1000000000UL
#define FAULT_DELAY_MAX 60000UL /* ms */

/* A completion xport_poll holds back until due (delay_ms). */
struct held_comp {
  xport_completion_t c;
  long due_us;
  struct xport__detail *detail; /* the provider's text, copied: its own ends at the next poll */
};

struct xport__fault {
  xport_ctx_t *ctx;             /* the owner: the application's context */
  unsigned long mr_reg;         /* the registration of the process that fails, or 0 */
  unsigned long drop_conn;      /* posts after which a connection is lost, or 0 */
  unsigned long eagain;         /* every Nth post is pushed back, or 0 */
  unsigned long delay_ms;       /* completions are held this long, or 0 */
  unsigned long posts;          /* posts counted for eagain (the context's, both transports) */
  size_t drops_due;             /* connections marked fault_drop, not yet lost */
  /* Held completions, oldest first: a ring of cap entries from head. */
  struct held_comp *q;
  size_t cap, head, len;
  struct xport__detail *shown;  /* details delivered by the last poll */
};

/* Registrations made under a mr_reg rule, in this process (the rule
 * names "the process's Nth"; contexts of several threads count together). */
static unsigned long reg_count;

static long now_us(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000000L + ts.tv_nsec / 1000L;
}

/* One RULE; 0, or -XPORT_EINVAL with why (at most len bytes) in why. */
static int parse_rule(struct xport__fault *f, const char *rule, size_t rlen, char *why,
                      size_t wlen)
{
  static const struct {
    const char *name;
    size_t off;
    unsigned long min, max;
  } rules[] = {
      {"mr_reg", offsetof(struct xport__fault, mr_reg), 1, FAULT_COUNT_MAX},
      {"drop_conn", offsetof(struct xport__fault, drop_conn), 1, FAULT_COUNT_MAX},
      /* eagain:1 would push every post back, for ever: no retry could pass. */
      {"eagain", offsetof(struct xport__fault, eagain), 2, FAULT_COUNT_MAX},
      {"delay_ms", offsetof(struct xport__fault, delay_ms), 1, FAULT_DELAY_MAX},
  };
  const char *colon = memchr(rule, ':', rlen);
  size_t nlen = colon ? (size_t)(colon - rule) : rlen;
  for (size_t i = 0; i < sizeof rules / sizeof rules[0]; i++) {
    if (strlen(rules[i].name) != nlen || strncmp(rule, rules[i].name, nlen))
      continue;
    unsigned long *v = (unsigned long *)(void *)((char *)f + rules[i].off);
    const char *d = colon ? colon + 1 : rule + rlen, *end = rule + rlen;
    unsigned long n = 0;
    if (d == end) {
      snprintf(why, wlen, "%.*s has no value (%s:N)", (int)rlen, rule, rules[i].name);
      return -XPORT_EINVAL;
    }
    for (; d < end; d++) {
      if (*d < '0' || *d > '9' || n > rules[i].max) {
        snprintf(why, wlen, "%.*s: the value is not a number from %lu to %lu", (int)rlen, rule,
                 rules[i].min, rules[i].max);
        return -XPORT_EINVAL;
      }
      n = n * 10 + (unsigned long)(*d - '0');
    }
    if (n < rules[i].min || n > rules[i].max) {
      snprintf(why, wlen, "%.*s: the value is not a number from %lu to %lu", (int)rlen, rule,
               rules[i].min, rules[i].max);
      return -XPORT_EINVAL;
    }
    if (*v) {
      snprintf(why, wlen, "%s is given twice", rules[i].name);
      return -XPORT_EINVAL;
    }
    *v = n;
    return 0;
  }
  snprintf(why, wlen, "\"%.*s\" is no rule (mr_reg:N, drop_conn:N, delay_ms:N, eagain:N)",
           (int)rlen, rule);
  return -XPORT_EINVAL;
}

int xport__fault_new(struct xport__fault **f_p)
{
  const char *spec = xport__env_str(XPORT__ENV_FAULT);
  *f_p = NULL;
  if (!spec)
    return 0;
  struct xport__fault *f = calloc(1, sizeof *f);
  if (!f)
    return -XPORT_ENOMEM;
  char why[160] = "";
  int ret = 0;
  for (const char *p = spec;;) {
    const char *comma = strchr(p, ',');
    size_t rlen = comma ? (size_t)(comma - p) : strlen(p);
    if (!rlen) {
      snprintf(why, sizeof why, "an empty rule");
      ret = -XPORT_EINVAL;
    } else {
      ret = parse_rule(f, p, rlen, why, sizeof why);
    }
    if (ret || !comma)
      break;
    p = comma + 1;
  }
  if (ret) {
    /* A test that meant to inject a fault must not pass without it. */
    XPORT__LOG(XPORT__LOG_ERROR, "XPORT_FAULT=%s: %s: no context is created", spec, why);
    free(f);
    return ret;
  }
  XPORT__INFO("XPORT_FAULT=%s: fault injection on", spec);
  *f_p = f;
  return 0;
}

void xport__fault_free(struct xport__fault *f)
{
  free(f);
}

void xport__fault_attach(xport_ctx_t *ctx, struct xport__fault *f)
{
  if (!f)
    return;
  f->ctx = ctx;
  XPORT__LOCK(ctx);
  ctx->fault = f;
  XPORT__UNLOCK(ctx);
}

/* Gives back the hold a queued completion had on its connection. */
static void held_release(struct held_comp *h)
{
  xport_conn_t *conn = h->c.conn;
  free(h->detail);
  h->detail = NULL;
  if (conn) {
    conn->nreqs--;
    xport__conn_free_if_done(conn);
  }
}

static void shown_end(struct xport__fault *f)
{
  while (f->shown) {
    struct xport__detail *d = f->shown;
    f->shown = d->next;
    free(d);
  }
}

void xport__fault_fini(xport_ctx_t *ctx)
{
  struct xport__fault *f = ctx->fault;
  if (!f || f->ctx != ctx)
    return;
  for (; f->len; f->len--, f->head = (f->head + 1) % f->cap)
    held_release(&f->q[f->head]);
  shown_end(f);
  free(f->q);
  ctx->fault = NULL;
  xport__fault_free(f);
}

/* Loses the connections of c's lanes that reached their count. Called
 * with c's lock held, or with no lock of c's held (it takes it). */
static void drops_run(struct xport__fault *f, xport_ctx_t *c)
{
  XPORT__LOCK(c);
  for (unsigned l = 0; l < c->nlanes; l++) {
    for (xport_conn_t *conn = c->lanes[l]->conns, *next; conn && f->drops_due; conn = next) {
      next = conn->next;
      if (!conn->fault.drop)
        continue;
      conn->fault.drop = 0;
      f->drops_due--;
      if (conn->state != XPORT__CONN_CONNECTED)
        continue;
      XPORT__INFO("XPORT_FAULT: connection %u is dropped after %lu posts", conn->id, f->drop_conn);
      conn->lane->tp->drop(conn, -XPORT_ECONNRESET);
    }
  }
  XPORT__UNLOCK(c);
}

static void drops_all(struct xport__fault *f)
{
  drops_run(f, f->ctx);
}

int xport__fault_post(xport_conn_t *conn)
{
  struct xport__fault *f = conn->ctx->fault;
  if (f->drops_due)
    drops_run(f, conn->ctx);
  /* A post that fails anyway (a lost connection) fails as it would. */
  if (conn->state != XPORT__CONN_CONNECTED)
    return 0;
  if (f->eagain && ++f->posts % f->eagain == 0) {
    XPORT__DEBUG("XPORT_FAULT: post %lu is pushed back", f->posts);
    return -XPORT_EAGAIN;
  }
  if (f->drop_conn && ++conn->fault.posts == f->drop_conn) {
    /* Lost at the context's next call into xport: this post goes first,
     * as the last one before the peer's end. */
    conn->fault.drop = 1;
    f->drops_due++;
  }
  return 0;
}

int xport__fault_mr_reg(xport_ctx_t *ctx)
{
  struct xport__fault *f = ctx->fault;
  if (!f->mr_reg || __atomic_add_fetch(&reg_count, 1, __ATOMIC_RELAXED) != f->mr_reg)
    return 0;
  XPORT__INFO("XPORT_FAULT: registration %lu of this process fails", f->mr_reg);
  return 1;
}

/* Room for need more held completions; 0, or -XPORT_ENOMEM. */
static int queue_room(struct xport__fault *f, size_t need)
{
  if (f->cap - f->len >= need)
    return 0;
  size_t cap = f->cap ? 2 * f->cap : 64;
  while (cap - f->len < need)
    cap *= 2;
  struct held_comp *q = malloc(cap * sizeof *q);
  if (!q)
    return -XPORT_ENOMEM;
  for (size_t i = 0; i < f->len; i++)
    q[i] = f->q[(f->head + i) % f->cap];
  free(f->q);
  f->q = q;
  f->cap = cap;
  f->head = 0;
  return 0;
}

int xport__fault_poll(xport_ctx_t *ctx, xport_completion_t *comps, int max,
                      int (*poll)(xport_ctx_t *, xport_completion_t *, int))
{
  struct xport__fault *f = ctx->fault;
  if (f->drops_due)
    drops_all(f);
  if (!f->delay_ms)
    return poll(ctx, comps, max);
  shown_end(f);
  /* Whatever has come is taken now, and stamped: its delay runs from
   * here, whatever the caller's max. Room first, so that nothing taken
   * is lost (without memory, what is held is still delivered). */
  xport_completion_t got[XPORT__CQ_BATCH];
  int n = queue_room(f, XPORT__CQ_BATCH) ? 0 : poll(ctx, got, XPORT__CQ_BATCH);
  if (n < 0)
    return n;
  long due = now_us() + (long)f->delay_ms * 1000L;
  for (int i = 0; i < n; i++) {
    struct held_comp *h = &f->q[(f->head + f->len++) % f->cap];
    h->c = got[i];
    h->due_us = due;
    h->detail = NULL;
    h->c.detail = NULL;
    if (got[i].detail) {
      size_t len = strlen(got[i].detail);
      if ((h->detail = malloc(sizeof *h->detail + len + 1))) {
        memcpy(h->detail->text, got[i].detail, len + 1);
        h->c.detail = h->detail->text;
      }
    }
    /* Its connection stays until it is delivered, as it would for a
     * request on the done list. */
    if (h->c.conn)
      h->c.conn->nreqs++;
  }
  long now = now_us();
  int out = 0;
  while (out < max && f->len && f->q[f->head].due_us <= now) {
    struct held_comp *h = &f->q[f->head];
    comps[out] = h->c;
    if (h->detail) { /* valid until the next poll, as xport_poll(3) says */
      h->detail->next = f->shown;
      f->shown = h->detail;
      h->detail = NULL;
    }
    held_release(h);
    f->head = (f->head + 1) % f->cap;
    f->len--;
    out++;
  }
  return out;
}

int xport__fault_wait(xport_ctx_t *ctx, int timeout_ms, int (*wait)(xport_ctx_t *, int))
{
  struct xport__fault *f = ctx->fault;
  if (f->drops_due)
    drops_all(f);
  if (!f->len)
    return wait(ctx, timeout_ms);
  /* A held completion wakes nothing when it falls due: sleep no longer. */
  long left_us = f->q[f->head].due_us - now_us();
  if (left_us <= 0)
    return 0;
  int left = (int)((left_us + 999) / 1000);
  if (timeout_ms >= 0 && timeout_ms < left)
    return wait(ctx, timeout_ms);
  int ret = wait(ctx, left);
  return ret == -XPORT_ETIMEDOUT ? 0 : ret;
}

void xport__fault_forget(xport_conn_t *conn)
{
  struct xport__fault *f = conn->ctx->fault;
  if (conn->fault.drop) { /* closed first: it leaves the list drops_run walks */
    conn->fault.drop = 0;
    f->drops_due--;
  }
  /* A closed connection's disconnect event is never delivered
   * (xport_conn_close(3)); held ones neither. Kept in order. */
  size_t kept = 0;
  for (size_t i = 0; i < f->len; i++) {
    struct held_comp *h = &f->q[(f->head + i) % f->cap];
    if (h->c.conn == conn && h->c.op == XPORT_OP_DISCONNECT) {
      held_release(h);
      continue;
    }
    f->q[(f->head + kept++) % f->cap] = *h;
  }
  f->len = kept;
}
