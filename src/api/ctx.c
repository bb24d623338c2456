/* The context and its capability probe: enumerate fi_getinfo candidates,
 * judge and rank them, open the first that works, and keep the verdicts
 * so that the choice can be explained later (xport_ctx_candidates). */
#include "xport_int.h"

#include <ifaddrs.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <unistd.h>

static pthread_once_t log_once = PTHREAD_ONCE_INIT;

struct settings {
  const char *provider;
  const char *domain;
  const char *iface;
  int strict;
  int progress_thread;
  int wait_fd;
  int delivery_complete;
  int delivery_complete_set; /* by the attribute or the environment */
  xport_auth_t auth;         /* where the key came from, or XPORT_AUTH_OFF */
  uint8_t auth_key[XPORT__AUTH_KEY];
};

static int pick_switch(xport_switch_t v, enum xport__env_id id, int def)
{
  if (v == XPORT_ON)
    return 1;
  if (v == XPORT_OFF)
    return 0;
  return xport__env_bool(id, def);
}

/* An explicit attribute beats the environment, which beats the default. */
static void resolve_settings(const xport_ctx_attr_t *attr, struct settings *s)
{
  static const xport_ctx_attr_t none;
  if (!attr)
    attr = &none;
  s->provider = attr->provider ? attr->provider : xport__env_str(XPORT__ENV_PROVIDER);
  s->domain = attr->domain ? attr->domain : xport__env_str(XPORT__ENV_DOMAIN);
  s->iface = attr->iface ? attr->iface : xport__env_str(XPORT__ENV_IFACE);
  s->strict = pick_switch(attr->strict, XPORT__ENV_STRICT, 0);
  s->progress_thread = pick_switch(attr->progress_thread, XPORT__ENV_PROGRESS_THREAD, 0);
  s->wait_fd = pick_switch(attr->wait_fd, XPORT__ENV_WAIT_FD, 1);
  s->delivery_complete = pick_switch(attr->delivery_complete, XPORT__ENV_DELIVERY_COMPLETE, 0);
  s->delivery_complete_set = attr->delivery_complete != XPORT_UNSET ||
                             xport__env_str(XPORT__ENV_DELIVERY_COMPLETE);
}

/* The key connections prove: the attribute's, else the file that
 * XPORT_AUTH_KEY_FILE names, else none. A key asked for and not usable
 * fails the context rather than leave it open to anyone. */
static int resolve_key(const xport_ctx_attr_t *attr, struct settings *s)
{
  const char *file = xport__env_str(XPORT__ENV_AUTH_KEY_FILE);
  int ret = 0;
  s->auth = XPORT_AUTH_OFF;
  if (attr && (attr->auth_key || attr->auth_key_len)) {
    ret = xport__auth_key(attr->auth_key, attr->auth_key_len, s->auth_key);
    if (ret)
      XPORT__WARN("xport_ctx_attr_t.auth_key: %zu bytes; a key has %d or more",
                  attr->auth_key ? attr->auth_key_len : 0, XPORT__AUTH_KEY_MIN);
    s->auth = XPORT_AUTH_ATTR;
  } else if (file) {
    ret = xport__auth_key_file(file, s->auth_key);
    s->auth = XPORT_AUTH_FILE;
  }
  if (ret) {
    xport__auth_wipe(s->auth_key, sizeof s->auth_key);
    s->auth = XPORT_AUTH_OFF;
  }
  return ret;
}

/* Position of prov in a comma-separated list, or -1. */
static int list_pos(const char *list, const char *prov)
{
  size_t plen = strlen(prov);
  int pos = 0;
  for (const char *p = list; *p; pos++) {
    const char *end = strchr(p, ',');
    size_t n = end ? (size_t)(end - p) : strlen(p);
    while (n && *p == ' ') { p++; n--; }
    while (n && p[n - 1] == ' ') n--;
    if (n == plen && !strncmp(p, prov, n))
      return pos;
    if (!end)
      break;
    p = end + 1;
  }
  return -1;
}

static int sockaddr_eq(const struct sockaddr *a, const struct sockaddr *b)
{
  if (!a || !b || a->sa_family != b->sa_family)
    return 0;
  if (a->sa_family == AF_INET)
    return !memcmp(&((const struct sockaddr_in *)a)->sin_addr,
                   &((const struct sockaddr_in *)b)->sin_addr, sizeof(struct in_addr));
  if (a->sa_family == AF_INET6)
    return !memcmp(&((const struct sockaddr_in6 *)a)->sin6_addr,
                   &((const struct sockaddr_in6 *)b)->sin6_addr, sizeof(struct in6_addr));
  return 0;
}

/* Whether a candidate lives on the interface: its domain carries the
 * interface's name (tcp) or its source address is one of the
 * interface's addresses (providers that name domains by device). */
static int on_iface(const struct fi_info *fi, const char *iface,
                    struct ifaddrs *ifs)
{
  if (fi->domain_attr->name && !strcmp(fi->domain_attr->name, iface))
    return 1;
  if (fi->addr_format != FI_SOCKADDR_IN && fi->addr_format != FI_SOCKADDR_IN6 &&
      fi->addr_format != FI_SOCKADDR)
    return 0;
  for (struct ifaddrs *i = ifs; i; i = i->ifa_next)
    if (i->ifa_name && !strcmp(i->ifa_name, iface) &&
        sockaddr_eq(i->ifa_addr, fi->src_addr))
      return 1;
  return 0;
}

struct cand {
  struct fi_info *fi;
  int rank;
  int idx; /* fi_getinfo order, to keep the sort stable */
};

static int cand_cmp(const void *a, const void *b)
{
  const struct cand *x = a, *y = b;
  if (x->rank != y->rank)
    return x->rank < y->rank ? -1 : 1;
  return x->idx - y->idx;
}

static void set_cand(xport_candidate_t *c, const struct fi_info *fi,
                     xport_verdict_t v, const char *reason)
{
  xport__strlcpy(c->provider, fi->fabric_attr->prov_name, sizeof c->provider);
  xport__strlcpy(c->fabric, fi->fabric_attr->name, sizeof c->fabric);
  xport__strlcpy(c->domain, fi->domain_attr->name, sizeof c->domain);
  c->ep_type = fi->ep_attr->type == FI_EP_RDM ? XPORT_EP_RDM : XPORT_EP_MSG;
  c->verdict = v;
  xport__strlcpy(c->reason, reason, sizeof c->reason);
}

/* The transport's remark, after what a candidate's reason says already. */
static void cand_remark(xport_candidate_t *c, const struct xport__lane *lane)
{
  char r[sizeof c->reason];
  if (!lane->tp->remark)
    return;
  r[0] = '\0';
  lane->tp->remark(lane, r, sizeof r);
  size_t n = strlen(c->reason);
  if (r[0] && n + 3 < sizeof c->reason)
    snprintf(c->reason + n, sizeof c->reason - n, "; %s", r);
}

/* The ordering xport(7) promises on one connection: messages in order
 * (SAS), a message after a write delivered after its data (SAW: the
 * emulated write-with-immediate depends on it), writes applied in order
 * (WAW) and a read seeing earlier writes (RAW). */
#define ORDER_NEEDED (FI_ORDER_SAS | FI_ORDER_SAW | FI_ORDER_WAW | FI_ORDER_RAW)

/* Whether the provider can complete a write only once the target has its
 * data: asked of libfabric for this very candidate. */
static int offers_delivery_complete(const struct fi_info *fi)
{
  struct fi_info *h = fi_dupinfo(fi), *got = NULL;
  if (!h)
    return 0;
  free(h->src_addr);
  free(h->dest_addr);
  h->src_addr = h->dest_addr = NULL;
  h->src_addrlen = h->dest_addrlen = 0;
  free(h->fabric_attr->name);
  h->fabric_attr->name = NULL;
  h->tx_attr->op_flags |= FI_DELIVERY_COMPLETE;
  int ok = fi_getinfo(XPORT__FI_VERSION, NULL, NULL, 0, h, &got) == 0;
  fi_freeinfo(got);
  fi_freeinfo(h);
  return ok;
}

/* Judges one candidate; returns its rank, or -1 with why in reason. */
static int judge(const struct fi_info *fi, const struct settings *s,
                 struct ifaddrs *ifs, char *reason, size_t rlen)
{
  const char *prov = fi->fabric_attr->prov_name;
  const struct xport__profile *prof = xport__profile_find(prov);
  int named = s->provider && s->provider[0] != '^';
  int rank;

  if (named) {
    int pos = list_pos(s->provider, prov);
    if (pos < 0) {
      snprintf(reason, rlen, "not requested (XPORT_PROVIDER=%s)", s->provider);
      return -1;
    }
    rank = pos;
  } else {
    if (s->provider && list_pos(s->provider + 1, prov) >= 0) {
      snprintf(reason, rlen, "excluded by XPORT_PROVIDER=%s", s->provider);
      return -1;
    }
    if (!prof) {
      snprintf(reason, rlen, "not ranked by xport; name it in XPORT_PROVIDER to use it");
      return -1;
    }
    if (prof->explicit_only) {
      snprintf(reason, rlen, "%s", prof->explicit_only);
      return -1;
    }
    rank = prof->rank;
  }
  if (s->domain && (!fi->domain_attr->name || strcmp(fi->domain_attr->name, s->domain))) {
    snprintf(reason, rlen, "no such device: domain %s is not XPORT_DOMAIN=%s",
             fi->domain_attr->name ? fi->domain_attr->name : "?", s->domain);
    return -1;
  }
  /* A node-local provider has no network interface: a job that sets
   * XPORT_IFACE for all its runs must still be able to name it. Unnamed,
   * it is on no interface: an XPORT_IFACE that matches nothing (a typo)
   * must not leave a context that reaches this node only. */
  if (s->iface && !(named && prof && prof->node_local) && !on_iface(fi, s->iface, ifs)) {
    snprintf(reason, rlen, "not on interface XPORT_IFACE=%s", s->iface);
    return -1;
  }
  if (fi->domain_attr->cq_data_size < 4) {
    snprintf(reason, rlen, "carries %zu bytes of immediate data; xport needs 4",
             fi->domain_attr->cq_data_size);
    return -1;
  }
  if (fi->domain_attr->mr_mode & FI_MR_ENDPOINT) {
    snprintf(reason, rlen, "requires FI_MR_ENDPOINT, which xport does not support yet");
    return -1;
  }
  /* The hints ask for it; a provider that answers anyway without it
   * cannot keep xport(7)'s promises. */
  if ((fi->tx_attr->msg_order & ORDER_NEEDED) != ORDER_NEEDED ||
      (fi->rx_attr->msg_order & ORDER_NEEDED) != ORDER_NEEDED) {
    snprintf(reason, rlen, "does not order writes, reads and messages on one connection "
             "(msg_order 0x%llx)", (unsigned long long)fi->tx_attr->msg_order);
    return -1;
  }
  if (s->delivery_complete && !(prof && prof->writes_acked) && !offers_delivery_complete(fi)) {
    snprintf(reason, rlen, "cannot complete a write once delivered (FI_DELIVERY_COMPLETE), "
             "as XPORT_DELIVERY_COMPLETE asks");
    return -1;
  }
  return rank;
}

static void close_fids(struct xport__lane *lane)
{
  if (lane->halfopen_spare >= 0)
    close(lane->halfopen_spare);
  lane->halfopen_spare = -1;
  if (lane->tick_fd >= 0)
    close(lane->tick_fd); /* its epfd entry goes with it */
  lane->tick_fd = -1;
  /* An endpoint left open (close_after_refusal_crashes, settle_names) is
   * bound to these. */
  if (lane->keep_fids) {
    xport__fid_keep(lane->cq ? &lane->cq->fid : NULL);
    xport__fid_keep(lane->eq ? &lane->eq->fid : NULL);
    xport__fid_keep(lane->domain ? &lane->domain->fid : NULL);
    xport__fid_keep(lane->fabric ? &lane->fabric->fid : NULL);
    lane->cq = NULL, lane->eq = NULL, lane->domain = NULL, lane->fabric = NULL;
  }
  if (lane->cq)
    fi_close(&lane->cq->fid);
  if (lane->eq)
    fi_close(&lane->eq->fid);
  if (lane->domain)
    fi_close(&lane->domain->fid);
  if (lane->fabric)
    fi_close(&lane->fabric->fid);
  lane->cq = NULL;
  lane->eq = NULL;
  lane->cq_fd = lane->eq_fd = -1;
  lane->domain = NULL;
  lane->fabric = NULL;
  if (lane->sink)
    munmap(lane->sink, lane->sink_len);
  lane->sink = NULL;
}

/* truncation_hangs: reserves the sink, as large as the address space
 * allows up to 64 GiB, which then bounds messages. */
static int sink_open(struct xport__lane *lane)
{
  if (lane->caps.max_iov < 2)
    return -XPORT_ENOSYS; /* no room for it; no such provider yet */
  for (size_t len = (size_t)64 << 30; len >= (size_t)16 << 20; len /= 2) {
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p != MAP_FAILED) {
      lane->sink = p;
      lane->sink_len = len;
      lane->caps.max_iov--;
      if (lane->caps.max_msg_size > len)
        lane->caps.max_msg_size = len;
      return 0;
    }
  }
  return -XPORT_ENOMEM;
}

/* Opens fabric, domain, EQ and CQ for one candidate; 0 or -FI_E*. */
static int open_candidate(struct xport__lane *lane, struct fi_info *fi, const struct settings *s,
                          const char **what)
{
  int strict = s->strict;
  struct fi_eq_attr eq_attr = {.size = 64, .wait_obj = FI_WAIT_FD};
  /* Over RDM the tag tells the message ending an emulated write_imm. */
  int rdm = fi->ep_attr->type == FI_EP_RDM;
  struct fi_cq_attr cq_attr = {.format = rdm ? FI_CQ_FORMAT_TAGGED : FI_CQ_FORMAT_DATA,
                               .wait_obj = s->wait_fd ? FI_WAIT_FD : FI_WAIT_NONE};
  int ret;

  /* Strict mode asks for what verbs imposes; providers that merely allow
   * it (tcp) then use virtual addresses and their own keys. */
  const struct xport__profile *prof = xport__profile_find(fi->fabric_attr->prov_name);
  if (prof)
    fi->domain_attr->mr_mode &= ~prof->clear_mr_mode;
  if (strict)
    fi->domain_attr->mr_mode |= FI_MR_VIRT_ADDR | FI_MR_PROV_KEY | FI_MR_ALLOCATED;

  *what = "fi_fabric";
  ret = fi_fabric(fi->fabric_attr, &lane->fabric, lane);
  if (ret)
    goto fail;
  *what = "fi_domain";
  ret = fi_domain(lane->fabric, fi, &lane->domain, lane);
  if (ret)
    goto fail;
  if (fi->ep_attr->type == FI_EP_MSG) { /* RDM has no connection manager */
    *what = "fi_eq_open";
    ret = fi_eq_open(lane->fabric, &eq_attr, &lane->eq, lane);
    if (ret == -FI_ENOSYS || ret == -FI_EINVAL) {
      eq_attr.wait_obj = FI_WAIT_UNSPEC;
      ret = fi_eq_open(lane->fabric, &eq_attr, &lane->eq, lane);
    }
    if (ret)
      goto fail;
  }
  *what = "fi_cq_open";
  /* One CQ serves every connection of the context. Over FI_EP_MSG each
   * connection is an endpoint of its own, so size it for many (a verbs
   * CQ that overflows breaks every queue pair on it); an RDM endpoint
   * serves all connections through one queue pair of sizes. Hardware
   * caps the size (rxe: 32k entries; rxm sizes its own CQ after ours). */
  cq_attr.size = fi->rx_attr->size + fi->tx_attr->size;
  if (fi->ep_attr->type == FI_EP_MSG)
    cq_attr.size *= 16;
  if (cq_attr.size > 16384)
    cq_attr.size = 16384;
  /* Never more operations out than the CQ has entries for, less room for
   * the control messages of RDM endpoints. */
  lane->max_posted = cq_attr.size - (cq_attr.size / 8 > 64 ? cq_attr.size / 8 : 64);
  ret = fi_cq_open(lane->domain, &cq_attr, &lane->cq, lane);
  if (ret == -FI_ENOSYS || ret == -FI_EINVAL) {
    /* No wait fd (shm): xport_wait sleeps in steps of its own. */
    cq_attr.wait_obj = FI_WAIT_NONE;
    ret = fi_cq_open(lane->domain, &cq_attr, &lane->cq, lane);
  }
  if (ret)
    goto fail;
  /* The wait fds, asked for once, and only of objects opened with one:
   * FI_GETWAIT on an object without a wait fd is not safe everywhere. */
  if (cq_attr.wait_obj == FI_WAIT_FD && fi_control(&lane->cq->fid, FI_GETWAIT, &lane->cq_fd))
    lane->cq_fd = -1;
  if (lane->eq && eq_attr.wait_obj == FI_WAIT_FD &&
      fi_control(&lane->eq->fid, FI_GETWAIT, &lane->eq_fd))
    lane->eq_fd = -1;
  return 0;
fail:
  close_fids(lane);
  return ret;
}

static void fill_caps(struct xport__lane *lane, const struct settings *s)
{
  const struct fi_info *fi = lane->info;
  xport_caps_t *c = &lane->caps;
  uint64_t m = fi->domain_attr->mr_mode;
  size_t iov = fi->tx_attr->iov_limit < fi->rx_attr->iov_limit ? fi->tx_attr->iov_limit
                                                                : fi->rx_attr->iov_limit;

  memset(c, 0, sizeof *c);
  xport__strlcpy(c->provider, fi->fabric_attr->prov_name, sizeof c->provider);
  xport__strlcpy(c->fabric, fi->fabric_attr->name, sizeof c->fabric);
  xport__strlcpy(c->domain, fi->domain_attr->name, sizeof c->domain);
  c->ep_type = fi->ep_attr->type == FI_EP_RDM ? XPORT_EP_RDM : XPORT_EP_MSG;
  c->max_msg_size = fi->ep_attr->max_msg_size;
  c->inject_size = fi->tx_attr->inject_size;
  c->max_iov = iov < XPORT__IOV_MAX ? (iov ? iov : 1) : XPORT__IOV_MAX;
  /* What xport enforces per connection (post returns EAGAIN beyond it):
   * the provider's queue sizes, less the receives the transport keeps
   * posted, within the profile's limit and the CQ's. */
  c->tx_depth = fi->tx_attr->size;
  size_t cap = lane->prof && lane->prof->max_tx_depth ? lane->prof->max_tx_depth() : 0;
  if (cap && c->tx_depth > cap)
    c->tx_depth = cap;
  c->rx_depth = fi->rx_attr->size;
  if (c->rx_depth > lane->tp->rx_reserved)
    c->rx_depth -= lane->tp->rx_reserved;
  /* An emulated write_imm holds two CQ entries (its write and its
   * message): a connection reaches tx_depth with any kind of post. */
  size_t tx_room = lane->native_wimm ? lane->max_posted : lane->max_posted / 2;
  if (c->tx_depth > tx_room)
    c->tx_depth = tx_room;
  if (c->rx_depth > lane->max_posted)
    c->rx_depth = lane->max_posted;
  c->imm_bits = 32;
  c->wire_imm_bytes = (unsigned)fi->domain_attr->cq_data_size;
  c->rma = (fi->caps & FI_RMA) ? XPORT_SUPPORT_NATIVE : XPORT_SUPPORT_NONE;
  /* Native where the provider has atomics xport may trust; else emulated
   * over MSG endpoints (atomic.c), which RDM ones cannot carry. */
  const char *why = lane->prof && lane->prof->atomics_untrusted ? lane->prof->atomics_untrusted()
                                                               : NULL;
  if ((fi->caps & FI_ATOMIC) && !why)
    c->atomics = XPORT_SUPPORT_NATIVE;
  else if (c->ep_type == XPORT_EP_MSG && lane->tp->atomic)
    c->atomics = XPORT_SUPPORT_EMULATED;
  else
    c->atomics = XPORT_SUPPORT_NONE;
  if (why && (fi->caps & FI_ATOMIC))
    XPORT__INFO("%s: native atomics not used: %s", c->provider, why);
  if (m & FI_MR_LOCAL)
    c->mr_mode |= XPORT_MR_LOCAL;
  if (m & FI_MR_VIRT_ADDR)
    c->mr_mode |= XPORT_MR_VIRT_ADDR;
  if (m & FI_MR_PROV_KEY)
    c->mr_mode |= XPORT_MR_PROV_KEY;
  if (m & FI_MR_ENDPOINT)
    c->mr_mode |= XPORT_MR_ENDPOINT;
  if (m & FI_MR_RAW)
    c->mr_mode |= XPORT_MR_RAW;
  if (s->strict)
    c->mr_mode |= XPORT_MR_LOCAL | XPORT_MR_VIRT_ADDR | XPORT_MR_PROV_KEY;
  /* xport_ctx_fd(3) gives a descriptor unless wait objects are off. */
  c->wait_fd = s->wait_fd;
  c->progress = (lane->prof && lane->prof->manual_progress) ||
                        fi->domain_attr->data_progress == FI_PROGRESS_MANUAL
                    ? XPORT_PROGRESS_MANUAL
                    : XPORT_PROGRESS_AUTO;
  c->strict = s->strict;
  c->progress_thread = s->progress_thread;
  c->delivery_complete = s->delivery_complete;
}

static struct fi_info *make_hints(enum fi_ep_type type, int secure)
{
  struct fi_info *h = fi_allocinfo();
  if (!h)
    return NULL;
  h->ep_attr->type = type;
  /* RDM endpoints carry many connections; tags tell them apart. */
  h->caps = FI_MSG | FI_RMA | (type == FI_EP_RDM ? FI_TAGGED : 0);
  /* And anyone may send to them: receives name their source, completions
   * their sender, and control messages land in multi-receive buffers,
   * where the provider can (transport/rdm.c). */
  if (type == FI_EP_RDM && secure)
    h->caps |= FI_DIRECTED_RECV | FI_SOURCE | FI_MULTI_RECV;
  /* Requests embed a fi_context2; completions of RMA with CQ data may
   * consume receives (verbs), which the data path handles. */
  h->mode = FI_CONTEXT | FI_CONTEXT2 | FI_RX_CQ_DATA;
  h->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED |
                            FI_MR_PROV_KEY | FI_MR_RAW;
  /* A context is used by one thread at a time, and its progress thread
   * takes the context's lock around every provider call: domain-level
   * serialization is ours, and the provider need not lock (shm and tcp
   * spend a good part of a 64-byte round trip in their locks). */
  h->domain_attr->threading = FI_THREAD_DOMAIN;
  /* What xport(7) promises on one connection (judge() checks the answer). */
  h->tx_attr->msg_order = ORDER_NEEDED;
  h->rx_attr->msg_order = ORDER_NEEDED;
  return h;
}

/* Logs what the probe saw when nothing could be used. */
static void log_no_provider(const struct settings *s, const xport_candidate_t *c, int n)
{
  char found[512] = "";
  size_t off = 0;
  for (int i = 0; i < n && off < sizeof found; i++) {
    int dup = 0;
    for (int j = 0; j < i; j++)
      dup |= !strcmp(c[i].provider, c[j].provider);
    if (!dup)
      off += (size_t)snprintf(found + off, sizeof found - off, "%s%s", off ? ", " : "",
                              c[i].provider);
  }
  XPORT__LOG(XPORT__LOG_ERROR,
             "no usable provider for XPORT_PROVIDER=%s (FI_EP_MSG or FI_EP_RDM with "
             "FI_MSG|FI_RMA); found: %s", s->provider ? s->provider : "(default)",
             n ? found : "none");
  /* Why each provider the settings let in was turned down, once per
   * distinct reason; the rest (not requested, excluded) say nothing new. */
  int named = s->provider && s->provider[0] != '^';
  for (int i = 0; i < n; i++) {
    if (named ? list_pos(s->provider, c[i].provider) < 0
              : s->provider && list_pos(s->provider + 1, c[i].provider) >= 0)
      continue;
    int dup = 0;
    for (int j = 0; j < i && !dup; j++)
      dup = !strcmp(c[i].provider, c[j].provider) && !strcmp(c[i].reason, c[j].reason);
    if (!dup)
      XPORT__LOG(XPORT__LOG_ERROR, "  %s: %s", c[i].provider, c[i].reason);
  }
  XPORT__LOG(XPORT__LOG_ERROR, "xport_info -v lists every candidate and its verdict");
  for (int i = 0; i < n; i++)
    XPORT__INFO("  %s %s/%s: %s", c[i].provider, c[i].fabric, c[i].domain, c[i].reason);
}

/* Connected endpoints first, then reliable-datagram ones (shm, rxm),
 * under which xport runs connections of its own. */
static int get_candidates(struct fi_info **list_p)
{
  static const enum fi_ep_type types[] = {FI_EP_MSG, FI_EP_RDM};
  struct fi_info *list = NULL, **tail = &list;
  for (size_t i = 0; i < 2; i++) {
    struct fi_info *got = NULL;
    int ret = -FI_ENODATA;
    /* RDM: with directed receives and sources first, else without. */
    for (int secure = types[i] == FI_EP_RDM; secure >= 0 && ret == -FI_ENODATA; secure--) {
      struct fi_info *hints = make_hints(types[i], secure);
      if (!hints) {
        fi_freeinfo(list);
        return -XPORT_ENOMEM;
      }
      ret = fi_getinfo(XPORT__FI_VERSION, NULL, NULL, 0, hints, &got);
      fi_freeinfo(hints);
    }
    if (ret && ret != -FI_ENODATA) {
      fi_freeinfo(list);
      return xport__err_from_fi(ret);
    }
    *tail = got;
    while (*tail)
      tail = &(*tail)->next;
  }
  *list_p = list;
  return 0;
}

/* The candidate as opened: with FI_ATOMIC where the provider has it
 * (asked separately, as providers without it, tcp, would not answer a
 * probe that asked for it), else as found. */
static struct fi_info *with_atomics(const struct fi_info *fi)
{
  const struct xport__profile *prof = xport__profile_find(fi->fabric_attr->prov_name);
  struct fi_info *h = fi_dupinfo(fi), *got = NULL;
  if (!h || (fi->caps & FI_ATOMIC))
    return h;
  uint64_t tx_order = h->tx_attr->msg_order, rx_order = h->rx_attr->msg_order;
  h->caps |= FI_ATOMIC;
  /* Only the order xport needs, or less where the provider's atomics
   * give no order with the rest (atomics_unordered). */
  for (int relax = 0; relax < 2; relax++) {
    if (relax && !(prof && prof->atomics_unordered))
      break;
    h->tx_attr->msg_order = h->rx_attr->msg_order = relax ? FI_ORDER_SAS : ORDER_NEEDED;
    int ret = fi_getinfo(XPORT__FI_VERSION, NULL, NULL, 0, h, &got);
    if (!ret && got && !strcmp(got->fabric_attr->prov_name, fi->fabric_attr->prov_name)) {
      fi_freeinfo(got->next); /* the first is the one asked for */
      got->next = NULL;
      fi_freeinfo(h);
      return got;
    }
    fi_freeinfo(got);
    got = NULL;
  }
  h->caps &= ~FI_ATOMIC;
  h->tx_attr->msg_order = tx_order;
  h->rx_attr->msg_order = rx_order;
  return h;
}

/* Ranks the candidates and opens the first that opens on lane; the
 * verdicts go to *cands_p (*ncands_p of them), whatever the outcome. */
static int probe(struct xport__lane *lane, const struct settings *s, xport_candidate_t **cands_p,
                 int *ncands_p)
{
  struct fi_info *list = NULL;
  struct ifaddrs *ifs = NULL;
  int nok = 0, n = 0, chosen = -1, ret;

  ret = get_candidates(&list);
  if (ret)
    return ret;
  /* As many as libfabric lists: a fixed cap once cut shm off the end of a
   * list that rxm's variables had lengthened. */
  size_t total = 0;
  for (struct fi_info *fi = list; fi; fi = fi->next)
    total++;
  struct cand *ok = calloc(total + 1, sizeof *ok);
  xport_candidate_t *rejected = calloc(total + 1, sizeof *rejected);
  (*cands_p) = calloc(total + 1, sizeof **cands_p);
  if (!ok || !rejected || !(*cands_p)) {
    free(ok);
    free(rejected);
    fi_freeinfo(list);
    return -XPORT_ENOMEM;
  }
  if (s->iface && getifaddrs(&ifs))
    ifs = NULL;
  /* Judge every candidate; the usable ones are ranked and tried below,
   * the rejected ones keep their reason. */
  int nrej = 0, idx = 0;
  for (struct fi_info *fi = list; fi; fi = fi->next, idx++) {
    char reason[160];
    int rank = judge(fi, s, ifs, reason, sizeof reason);
    if (rank < 0)
      set_cand(&rejected[nrej++], fi, XPORT_VERDICT_REJECTED, reason);
    else
      ok[nok++] = (struct cand){fi, rank, idx};
  }
  freeifaddrs(ifs);
  qsort(ok, (size_t)nok, sizeof *ok, cand_cmp);

  for (int i = 0; i < nok; i++) {
    xport_candidate_t *c = &(*cands_p)[n++];
    if (chosen >= 0) {
      set_cand(c, ok[i].fi, XPORT_VERDICT_USABLE, "usable; ranked after the chosen one");
      continue;
    }
    const char *what = "";
    struct fi_info *fi = with_atomics(ok[i].fi);
    ret = fi ? open_candidate(lane, fi, s, &what) : -FI_ENOMEM;
    if (ret) {
      char reason[160];
      snprintf(reason, sizeof reason, "failed to open: %s: %s", what, fi_strerror(-ret));
      set_cand(c, ok[i].fi, XPORT_VERDICT_REJECTED, reason);
      fi_freeinfo(fi);
      continue;
    }
    lane->info = fi;
    chosen = i;
    set_cand(c, fi, XPORT_VERDICT_CHOSEN, s->provider ? "first requested that opened"
                                                      : "highest ranked that opened");
  }
  for (int i = 0; i < nrej; i++)
    (*cands_p)[n++] = rejected[i];
  *ncands_p = n;
  free(ok);
  free(rejected);
  fi_freeinfo(list);
  if (chosen < 0) {
    log_no_provider(s, (*cands_p), n);
    return -XPORT_ENOPROV;
  }
  lane->prof = xport__profile_find(lane->info->fabric_attr->prov_name);
  /* Named on purpose, yet its users must hear what it cannot protect. */
  static int takeover_told;
  if (lane->prof && lane->prof->takeover && !__atomic_exchange_n(&takeover_told, 1, __ATOMIC_RELAXED))
    XPORT__WARN("%s: %s; use tcp (or verbs) where the nodes' other users are not trusted "
                "(xport(7), SECURITY)", lane->prof->name, lane->prof->takeover);
  return 0;
}

static void log_init(void)
{
  xport__log_init(xport__env_str(XPORT__ENV_LOG));
  for (size_t i = 0; xport__profiles[i]; i++)
    if (xport__profiles[i]->preinit)
      xport__profiles[i]->preinit();
}

/* Frees what lane_open made of lane (its provider objects closed). */
static void lane_free(struct xport__lane *lane)
{
  if (!lane)
    return;
  close_fids(lane);
  fi_freeinfo(lane->info);
  free(lane->tpd);
  free(lane);
}

/* Opens ctx's lane number index on the settings' provider (the probe's
 * choice), with its transport; the probe's verdicts go to *cands_p. The
 * context's settings (its id, its key, eager_size) are read already. */
static int lane_open(xport_ctx_t *ctx, unsigned index, struct settings s,
                     const struct xport__transport *own, xport_candidate_t **cands_p,
                     int *ncands_p, struct xport__lane **lane_p)
{
  int ret;
  struct xport__lane *lane = calloc(1, sizeof *lane);
  if (!lane)
    return -XPORT_ENOMEM;
  lane->ctx = ctx;
  lane->index = index;
  lane->cq_fd = lane->eq_fd = lane->halfopen_spare = lane->tick_fd = -1;
  /* A transport of its own provider describes itself; the others run on
   * what the probe chose. */
  ret = own ? own->describe(&lane->info) : probe(lane, &s, cands_p, ncands_p);
  if (ret)
    goto fail;
  /* Processes killed earlier may have left their endpoints' files. */
  if (lane->prof && lane->prof->sweep)
    lane->prof->sweep();
  uint64_t mm = lane->info->domain_attr->mr_mode;
  lane->need_local_mr = s.strict || (mm & FI_MR_LOCAL);
  lane->prov_key = !!(mm & FI_MR_PROV_KEY);
  lane->virt_addr = !!(mm & FI_MR_VIRT_ADDR);
  lane->raw_keys = !!(mm & FI_MR_RAW);
  int rdm = lane->info->ep_attr->type == FI_EP_RDM;
  lane->tp = own ? own : xport__transport_for(lane->info->ep_attr->type);
  lane->tpd = calloc(1, lane->tp->ctx_size ? lane->tp->ctx_size : 1);
  if (!lane->tpd) {
    ret = -XPORT_ENOMEM;
    goto fail;
  }
  lane->cq_entry_size = rdm ? sizeof(struct fi_cq_tagged_entry)
                                  : sizeof(struct fi_cq_data_entry);
  /* Where the provider does not consume a receive for write_imm, xport
   * emulates it, and that needs room for a marker: a tag bit over RDM,
   * the upper half of the CQ data over MSG. */
  lane->native_wimm = (lane->info->mode & FI_RX_CQ_DATA)                          ? 1
                      : rdm || lane->info->domain_attr->cq_data_size >= 8 ? 0
                                                                                : -1;
  lane->quick_inject = !lane->prof || !lane->prof->inject_needs_completion;
  if (lane->prof && lane->prof->rma_never_fails)
    lane->rma_timeout_ms = (long)xport__env_size(XPORT__ENV_RMA_TIMEOUT, 5000);
  if (!s.delivery_complete_set && lane->prof && lane->prof->dc_default)
    s.delivery_complete = 1;
  if (s.delivery_complete && !(lane->prof && lane->prof->writes_acked))
    lane->write_flags = FI_DELIVERY_COMPLETE;
  /* Control messages (RDM) travel in bounce slots too, whatever the
   * eager size: a slot holds at least one. */
  lane->bounce_size = (ctx->eager_size + 63) & ~(size_t)63;
  if (lane->bounce_size < XPORT__CTL_SLOT)
    lane->bounce_size = XPORT__CTL_SLOT;
  lane->source = rdm && (lane->info->caps & FI_SOURCE);
  if (lane->tp->open && (ret = lane->tp->open(lane)))
    goto fail;
  ret = xport__wait_fds(lane);
  if (ret)
    goto fail;
  if (!s.wait_fd)
    lane->no_wait = 2;
  fill_caps(lane, &s);
  lane->caps.auth = s.auth;
  if (lane->prof && lane->prof->truncation_hangs && (ret = sink_open(lane)))
    goto fail;
  lane->atom_emulated = lane->caps.atomics == XPORT_SUPPORT_EMULATED;
  lane->caps.write_imm = lane->native_wimm > 0    ? XPORT_SUPPORT_NATIVE
                         : lane->native_wimm == 0 ? XPORT_SUPPORT_EMULATED
                                                  : XPORT_SUPPORT_NONE;
  if (own && cands_p) {
    /* No probe, but a reader of the candidates learns what opened. */
    xport_candidate_t *c = calloc(1, sizeof *c);
    if (!c) {
      ret = -XPORT_ENOMEM;
      goto fail;
    }
    set_cand(c, lane->info, XPORT_VERDICT_CHOSEN,
             "xport's own transport, named (XPORT_PROVIDER, or XPORT_SHM=only): no probe");
    cand_remark(c, lane);
    *cands_p = c;
    *ncands_p = 1;
  }
  XPORT__INFO("chose %s on %s/%s%s", lane->caps.provider, lane->caps.fabric, lane->caps.domain,
              s.strict ? " (strict mode)" : "");
  *lane_p = lane;
  return 0;
fail:
  lane_free(lane);
  return ret;
}

/* The profile of the provider that reaches only this node, or NULL. */
static const struct xport__profile *node_local_profile(void)
{
  for (size_t i = 0; xport__profiles[i]; i++)
    if (xport__profiles[i]->node_local)
      return xport__profiles[i];
  return NULL;
}

/* The candidate of the node-local provider in ctx's probe list, which
 * then tells xport_ctx_candidates(3) readers what became of it. */
static xport_candidate_t *node_local_cand(xport_ctx_t *ctx, const char *prov)
{
  for (int i = 0; i < ctx->ncands; i++)
    if (!strcmp(ctx->cands[i].provider, prov))
      return &ctx->cands[i];
  return NULL;
}

/* xport's own node-local transport beside ctx's fabric; 0, or why not. */
static int own_local_open(xport_ctx_t *ctx, struct settings s, const char *mode)
{
  const struct xport__transport *own = xport__transport_node_local();
  struct xport__lane *lane;
  s.domain = NULL; /* XPORT_DOMAIN and XPORT_IFACE name the fabric's */
  s.iface = NULL;
  int ret = lane_open(ctx, 1, s, own, NULL, NULL, &lane);
  if (ret) {
    XPORT__INFO("%s beside %s: %s", own->name, ctx->lanes[0]->caps.provider,
                xport_strerror(ret));
    return ret;
  }
  ctx->lanes[ctx->nlanes++] = lane;
  /* Said where a user looks: a candidate of its own, after the probe's. */
  xport_candidate_t *more = realloc(ctx->cands, (size_t)(ctx->ncands + 1) * sizeof *more);
  if (more) {
    ctx->cands = more;
    xport_candidate_t *c = &ctx->cands[ctx->ncands++];
    memset(c, 0, sizeof *c);
    set_cand(c, lane->info, XPORT_VERDICT_CHOSEN, "");
    snprintf(c->reason, sizeof c->reason, "opened beside %s for peers on this node (XPORT_SHM=%s)",
             ctx->lanes[0]->caps.provider, mode);
    cand_remark(c, lane);
  }
  XPORT__INFO("%s opened beside %s for peers on this node", own->name,
              ctx->lanes[0]->caps.provider);
  return 0;
}

/* Peers on this node, as XPORT_SHM says: auto opens xport's own shared
 * memory beside ctx's fabric, libfabric's shm where that fails (memfd or
 * Unix sockets refused) or where XPORT_SHM=libfabric asks for it; xshm
 * opens xport's only. The same switches as the fabric; a failure leaves
 * the fabric alone, and says why in the candidate list. */
static void node_local_open(xport_ctx_t *ctx, struct settings s, const char *mode)
{
  const struct xport__profile *nl = node_local_profile();
  if (ctx->lanes[0]->tp == xport__transport_node_local() ||
      (ctx->lanes[0]->prof && ctx->lanes[0]->prof->node_local))
    return; /* the fabric is this node's already */
  xport_candidate_t *c = nl ? node_local_cand(ctx, nl->name) : NULL;
  int usable = c && c->verdict == XPORT_VERDICT_USABLE, own_ret = 0;
  if (!strcmp(mode, "auto") || !strcmp(mode, "xshm")) {
    own_ret = own_local_open(ctx, s, mode);
    c = nl ? node_local_cand(ctx, nl->name) : NULL; /* the list grew: it may have moved */
    if (!own_ret) {
      if (usable)
        snprintf(c->reason, sizeof c->reason,
                 "not opened: xport's own %s is beside %s (XPORT_SHM=libfabric opens this one)",
                 xport__transport_node_local()->name, ctx->lanes[0]->caps.provider);
      return;
    }
    if (!strcmp(mode, "xshm"))
      return;
  }
  if (!nl)
    return;
  if (!strcmp(mode, "off")) {
    if (usable)
      snprintf(c->reason, sizeof c->reason, "not opened for peers on this node: XPORT_SHM=off");
    return;
  }
  s.provider = nl->name;
  s.domain = NULL;
  s.iface = NULL;
  xport_candidate_t *cands = NULL;
  int ncands = 0;
  struct xport__lane *lane;
  int ret = lane_open(ctx, 1, s, NULL, &cands, &ncands, &lane);
  free(cands); /* the fabric's list tells what became of it */
  struct xport__lane *fabric = ctx->lanes[0];
  if (ret) {
    XPORT__INFO("%s beside %s: %s: peers on this node use %s", nl->name, fabric->caps.provider,
                xport_strerror(ret), fabric->caps.provider);
    if (c)
      snprintf(c->reason, sizeof c->reason, "XPORT_SHM=%s, but it failed to open: %s", mode,
               xport_strerror(ret));
    return;
  }
  ctx->lanes[ctx->nlanes++] = lane;
  if (c) {
    c->verdict = XPORT_VERDICT_CHOSEN;
    char why[96] = "";
    if (own_ret) /* auto, where xport's own failed */
      snprintf(why, sizeof why, ": %s failed to open: %s", xport__transport_node_local()->name,
               xport_strerror(own_ret));
    snprintf(c->reason, sizeof c->reason,
             "opened beside %s for peers on this node (XPORT_SHM=%s%s)", fabric->caps.provider,
             mode, why);
  }
  XPORT__INFO("%s opened beside %s for peers on this node", nl->name, fabric->caps.provider);
}

/* A context of one lane on own, or as the probe and XPORT_SHM decide. */
static int ctx_create(const struct xport__transport *own, const xport_ctx_attr_t *attr,
                      xport_ctx_t **ctx_p)
{
  struct settings s;
  if (!ctx_p)
    return -XPORT_EINVAL;
  pthread_once(&log_once, log_init);
  resolve_settings(attr, &s);
  int ret = resolve_key(attr, &s);
  if (ret)
    return ret;
  /* A transport of xport's own, named (XPORT_PROVIDER=xshm): no probe. */
  if (!own && s.provider)
    own = xport__transport_named(s.provider);
  const char *mode = xport__env_str(XPORT__ENV_SHM);
  if (!mode)
    mode = "auto";
  /* The boolean spellings too: one who writes XPORT_SHM=0 means off. */
  if (!strcasecmp(mode, "off") || !strcmp(mode, "0") || !strcasecmp(mode, "no") ||
      !strcasecmp(mode, "false"))
    mode = "off";
  else if (!strcasecmp(mode, "auto") || !strcmp(mode, "1") || !strcasecmp(mode, "yes") ||
           !strcasecmp(mode, "true") || !strcasecmp(mode, "on"))
    mode = "auto";
  else if (!strcasecmp(mode, "only"))
    mode = "only";
  else if (!strcasecmp(mode, "xshm"))
    mode = "xshm";
  else if (!strcasecmp(mode, "libfabric"))
    mode = "libfabric";
  else {
    XPORT__WARN("XPORT_SHM=%s is none of auto, off, only, xshm, libfabric: using off", mode);
    mode = "off"; /* a setting not understood adds no transport */
  }
  if (!strcmp(mode, "only") && !own)
    own = xport__transport_node_local();
  /* Before anything opens: a malformed value fails the call whole. */
  struct xport__fault *fault;
  ret = xport__fault_new(&fault);
  if (ret) {
    xport__auth_wipe(s.auth_key, sizeof s.auth_key);
    return ret;
  }
  xport_ctx_t *ctx = calloc(1, sizeof *ctx);
  if (!ctx) {
    xport__fault_free(fault);
    xport__auth_wipe(s.auth_key, sizeof s.auth_key);
    return -XPORT_ENOMEM;
  }
  ctx->wake.epfd = ctx->wake.sig_fd = ctx->dl.tick_fd = ctx->wake.nap_fd = -1;
  /* One identity over every lane: a peer sees the same context over
   * either transport (hellos, jobs, keys bound to the peer context). */
  ctx->id = xport__random_key(8);
  ctx->auth_on = s.auth != XPORT_AUTH_OFF;
  memcpy(ctx->auth_key, s.auth_key, sizeof ctx->auth_key);
  ctx->wimm_write_done = xport__wimm_write_done;
  ctx->wimm_retry = xport__wimm_retry;
  ctx->peer_check_ms = (long)xport__env_size(XPORT__ENV_PEER_TIMEOUT, 500);
  if (ctx->peer_check_ms < 4)
    ctx->peer_check_ms = 4;
  ctx->dl.op_ms = (long)xport__env_size(XPORT__ENV_OP_TIMEOUT, 0);
  ctx->dl.min_ms = ctx->dl.op_ms;
  ctx->eager_size = xport__env_size(XPORT__ENV_EAGER_SIZE, 8192);
  if (ctx->eager_size > XPORT__EAGER_MAX) {
    XPORT__WARN("XPORT_EAGER_SIZE=%zu is more than %zu; using %zu", ctx->eager_size,
                (size_t)XPORT__EAGER_MAX, (size_t)XPORT__EAGER_MAX);
    ctx->eager_size = XPORT__EAGER_MAX;
  }
  ret = lane_open(ctx, 0, s, own, &ctx->cands, &ctx->ncands, &ctx->lanes[0]);
  if (!ret) {
    ctx->nlanes = 1;
    if (!own)
      node_local_open(ctx, s, mode); /* the same key: one identity over both */
    if (s.progress_thread)
      ret = xport__progress_start(ctx);
  }
  xport__auth_wipe(s.auth_key, sizeof s.auth_key);
  if (!ret) /* XPORT_OP_TIMEOUT: a sleeper on the context's fd wakes for it */
    ret = xport__deadline_tick(ctx);
  if (ret) {
    xport__fault_free(fault);
    if (ctx->dl.tick_fd >= 0)
      close(ctx->dl.tick_fd);
    for (unsigned l = 0; l < ctx->nlanes; l++)
      lane_free(ctx->lanes[l]);
    if (ctx->wake.sig_fd >= 0)
      close(ctx->wake.sig_fd);
    if (ctx->wake.epfd >= 0)
      close(ctx->wake.epfd);
    free(ctx->cands);
    xport__auth_wipe(ctx->auth_key, sizeof ctx->auth_key);
    free(ctx);
    return ret;
  }
  xport__fault_attach(ctx, fault);
  *ctx_p = ctx;
  return 0;
}

XPORT_API int xport_ctx_create(const xport_ctx_attr_t *attr, xport_ctx_t **ctx_p)
{
  return ctx_create(NULL, attr, ctx_p);
}

int xport__ctx_create_on(const struct xport__transport *own, const xport_ctx_attr_t *attr,
                         xport_ctx_t **ctx_p)
{
  if (!own || !own->describe)
    return -XPORT_EINVAL;
  return ctx_create(own, attr, ctx_p);
}

XPORT_API int xport_ctx_destroy(xport_ctx_t *ctx)
{
  if (!ctx)
    return 0;
  if (ctx->nhooked) {
    /* A job's connections and listener: it would be left pointing here. */
    XPORT__WARN("xport_ctx_destroy: a job still uses this context: xport_job_fini it first");
    return -XPORT_EBUSY;
  }
  xport__progress_stop(ctx);
  /* What it holds back goes first, as the done list's does below. */
  xport__fault_fini(ctx);
  for (unsigned l = 0; l < ctx->nlanes; l++)
    while (ctx->lanes[l]->conns)
      xport_conn_close(ctx->lanes[l]->conns);
  /* The application's listeners, with their second lane's halves; then
   * any half left. */
  for (unsigned l = 0; l < ctx->nlanes; l++)
    while (ctx->lanes[l]->listeners)
      xport_listener_close(ctx->lanes[l]->listeners);
  /* The second lane first, as it opened last. */
  for (unsigned l = ctx->nlanes; l-- > 0;)
    if (ctx->lanes[l]->tp->fini)
      ctx->lanes[l]->tp->fini(ctx->lanes[l]);
  xport__wimm_retry(ctx, 1);
  /* Closed connections wait for their requests to be delivered; nobody
   * will poll now, so drop them along with their connections. */
  xport__done_discard(ctx);
  xport__pool_fini(ctx); /* its lent receives were on the done list */
  while (ctx->mrs)
    xport_mr_dereg(ctx->mrs);
  for (unsigned l = ctx->nlanes; l-- > 0;) {
    xport__bounce_fini(ctx->lanes[l]);
    lane_free(ctx->lanes[l]);
  }
  xport__req_fini(ctx);
  if (ctx->dl.tick_fd >= 0)
    close(ctx->dl.tick_fd);
  if (ctx->wake.nap_fd >= 0)
    close(ctx->wake.nap_fd);
  if (ctx->wake.sig_fd >= 0)
    close(ctx->wake.sig_fd);
  if (ctx->wake.epfd >= 0)
    close(ctx->wake.epfd);
  free(ctx->cands);
  xport__auth_wipe(ctx->auth_key, sizeof ctx->auth_key);
  free(ctx);
  return 0;
}

XPORT_API int xport_ctx_query(const xport_ctx_t *ctx, xport_caps_t *caps_p)
{
  if (!ctx || !caps_p)
    return -XPORT_EINVAL;
  *caps_p = ctx->lanes[0]->caps;
  return 0;
}

XPORT_API int xport_ctx_candidates(const xport_ctx_t *ctx,
                                   const xport_candidate_t **cands_p)
{
  if (!ctx || !cands_p)
    return -XPORT_EINVAL;
  *cands_p = ctx->cands;
  return ctx->ncands;
}
