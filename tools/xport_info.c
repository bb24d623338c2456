/* xport_info: what the probe saw, what it chose and why, and the
 * environment variables xport reads. Uses only the public header. */
#include <xport.h>

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#ifdef HAVE_IBVERBS
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#endif

static const char *verdict_name(xport_verdict_t v)
{
  return v == XPORT_VERDICT_CHOSEN ? "chosen" : v == XPORT_VERDICT_USABLE ? "usable" : "rejected";
}

static const char *support_name(xport_support_t s)
{
  return s == XPORT_SUPPORT_NATIVE ? "native" : s == XPORT_SUPPORT_EMULATED ? "emulated" : "none";
}

/* Where the key came from: never the key itself, which xport keeps to itself. */
static const char *auth_name(xport_auth_t a)
{
  return a == XPORT_AUTH_ATTR   ? "attr"
         : a == XPORT_AUTH_FILE ? "file"
         : a == XPORT_AUTH_JOB  ? "job"
                                : "off";
}

static const char *auth_text(xport_auth_t a)
{
  return a == XPORT_AUTH_ATTR   ? "on (key from xport_ctx_attr_t.auth_key)"
         : a == XPORT_AUTH_FILE ? "on (key from XPORT_AUTH_KEY_FILE)"
         : a == XPORT_AUTH_JOB  ? "on (the job's key, from its launcher)"
                                : "off (no key: any peer that reaches a listener may connect; "
                                  "see XPORT_AUTH_KEY_FILE)";
}

static void json_str(const char *s)
{
  putchar('"');
  for (; *s; s++) {
    if (*s == '"' || *s == '\\')
      printf("\\%c", *s);
    else if ((unsigned char)*s < 0x20)
      printf("\\u%04x", *s);
    else
      putchar(*s);
  }
  putchar('"');
}

static void mr_mode_str(unsigned m, char *buf, size_t len)
{
  static const struct { unsigned bit; const char *name; } bits[] = {
    {XPORT_MR_LOCAL, "local"}, {XPORT_MR_VIRT_ADDR, "virt_addr"},
    {XPORT_MR_PROV_KEY, "prov_key"}, {XPORT_MR_ENDPOINT, "endpoint"}, {XPORT_MR_RAW, "raw"}};
  size_t off = 0;
  buf[0] = '\0';
  for (size_t i = 0; i < sizeof bits / sizeof bits[0]; i++)
    if (m & bits[i].bit)
      off += (size_t)snprintf(buf + off, len - off, "%s%s", off ? "," : "", bits[i].name);
  if (!off)
    snprintf(buf, len, "none");
}

/* One row: the same entry as the table shows it, with the same verdict,
 * or the chosen one and a usable one that differs from it only in what
 * the table does not show (shm: two entries), which is no choice left. */
static int same_row(const xport_candidate_t *a, const xport_candidate_t *b)
{
  if (a->ep_type != b->ep_type || strcmp(a->provider, b->provider) ||
      strcmp(a->domain, b->domain) || strcmp(a->fabric, b->fabric))
    return 0;
  unsigned both = (1u << a->verdict) | (1u << b->verdict);
  return (a->verdict == b->verdict && !strcmp(a->reason, b->reason)) ||
         both == ((1u << XPORT_VERDICT_CHOSEN) | (1u << XPORT_VERDICT_USABLE));
}

/* libfabric lists one provider several times over where it answers
 * several of the probe's queries (rxm: six here), and those entries differ
 * only in what the table does not show: unless verbose, such rows are
 * one, with their count. */
static void print_cands(const xport_candidate_t *cands, int n, int verbose)
{
  printf("candidates (in rank order%s):\n", verbose ? ", every libfabric entry" : "");
  for (int i = 0; i < n; i++) {
    int count = 1, seen = 0;
    for (int j = 0; j < n && !verbose; j++)
      if (same_row(&cands[i], &cands[j])) {
        seen |= j < i;
        count += j > i;
      }
    if (seen)
      continue;
    char times[16] = "";
    if (count > 1)
      snprintf(times, sizeof times, "x%d", count);
    printf("  %-8s %-12s %-3s %-10s %-18s %-3s %s\n", verdict_name(cands[i].verdict),
           cands[i].provider, cands[i].ep_type == XPORT_EP_RDM ? "rdm" : "msg",
           cands[i].domain, cands[i].fabric, times, cands[i].reason);
  }
  if (!verbose)
    printf("  (xN: libfabric lists that row N times; -v shows every entry)\n");
}

static void print_text(const xport_caps_t *c, const xport_candidate_t *cands, int n,
                       int verbose)
{
  char mr[96];
  print_cands(cands, n, verbose);
  mr_mode_str(c->mr_mode, mr, sizeof mr);
  printf("\nchosen:\n"
         "  provider:        %s\n  fabric:          %s\n  domain:          %s\n"
         "  endpoint type:   %s\n  max message:     %zu\n  inject size:     %zu\n"
         "  max iov:         %zu\n  tx/rx depth:     %zu/%zu\n"
         "  immediate data:  %u bits (provider carries %u bytes)\n"
         "  rma:             %s\n  write_imm:       %s\n  atomics:         %s%s\n"
         "  registration:    %s\n"
         "  wait fd:         %s\n  progress:        %s%s\n  strict mode:     %s\n"
         "  write completes: %s\n",
         c->provider, c->fabric, c->domain, c->ep_type == XPORT_EP_RDM ? "rdm" : "msg",
         c->max_msg_size, c->inject_size, c->max_iov, c->tx_depth, c->rx_depth, c->imm_bits,
         c->wire_imm_bytes, support_name(c->rma), support_name(c->write_imm),
         support_name(c->atomics),
         c->atomics == XPORT_SUPPORT_EMULATED ? " (applied by the target's xport when it "
                                                "makes progress)"
         : c->atomics == XPORT_SUPPORT_NATIVE ? " (the provider's)"
                                              : "",
         mr, c->wait_fd ? "yes" : "no", c->progress == XPORT_PROGRESS_MANUAL ? "manual" : "auto",
         c->progress_thread ? " (progress thread on)" : "", c->strict ? "on" : "off",
         c->delivery_complete ? "once delivered to the target (XPORT_DELIVERY_COMPLETE)"
                              : "once the transport took the data (see xport(7), OUTCOMES)");
  printf("  authentication:  %s\n", auth_text(c->auth));
  /* A second chosen candidate is a transport opened beside the fabric
   * (XPORT_SHM): say which peers take which. */
  printf("  transports:      %s (every peer", c->provider);
  int more = 0;
  for (int i = 0; i < n; i++)
    if (cands[i].verdict == XPORT_VERDICT_CHOSEN && strcmp(cands[i].provider, c->provider)) {
      printf("%s), %s (peers on this node", more ? "" : " on another node", cands[i].provider);
      more = 1;
    }
  printf(")%s\n", more ? "; xport_conn_query(3) tells a connection's" : "");
}

static void print_json(const xport_caps_t *c, const xport_candidate_t *cands, int n)
{
  char mr[96];
  mr_mode_str(c->mr_mode, mr, sizeof mr);
  printf("{\"chosen\":{\"provider\":");
  json_str(c->provider);
  printf(",\"fabric\":");
  json_str(c->fabric);
  printf(",\"domain\":");
  json_str(c->domain);
  printf(",\"ep_type\":\"%s\",\"max_msg_size\":%zu,\"inject_size\":%zu,\"max_iov\":%zu,"
         "\"tx_depth\":%zu,\"rx_depth\":%zu,\"imm_bits\":%u,\"wire_imm_bytes\":%u,"
         "\"rma\":\"%s\",\"write_imm\":\"%s\",\"atomics\":\"%s\",\"mr_mode\":\"%s\",\"wait_fd\":%s,"
         "\"progress\":\"%s\",\"strict\":%s,\"delivery_complete\":%s,\"auth\":\"%s\"},"
         "\"candidates\":[",
         c->ep_type == XPORT_EP_RDM ? "rdm" : "msg", c->max_msg_size, c->inject_size,
         c->max_iov, c->tx_depth, c->rx_depth, c->imm_bits, c->wire_imm_bytes,
         support_name(c->rma), support_name(c->write_imm), support_name(c->atomics), mr,
         c->wait_fd ? "true" : "false",
         c->progress == XPORT_PROGRESS_MANUAL ? "manual" : "auto", c->strict ? "true" : "false",
         c->delivery_complete ? "true" : "false", auth_name(c->auth));
  for (int i = 0; i < n; i++) {
    printf("%s{\"provider\":", i ? "," : "");
    json_str(cands[i].provider);
    printf(",\"fabric\":");
    json_str(cands[i].fabric);
    printf(",\"domain\":");
    json_str(cands[i].domain);
    printf(",\"verdict\":\"%s\",\"reason\":", verdict_name(cands[i].verdict));
    json_str(cands[i].reason);
    printf("}");
  }
  printf("]}\n");
}

static int print_env(void)
{
  const xport_env_var_t *v;
  int n = xport_env_list(&v);
  for (int i = 0; i < n; i++) {
    const char *cur = getenv(v[i].name);
    printf("# %s: %s\n# %s\n%s=%s%s\n\n", v[i].name, v[i].type, v[i].help, v[i].name,
           cur ? cur : v[i].def, cur ? "" : "  (default)");
  }
  return 0;
}

/* Registered memory counts against RLIMIT_MEMLOCK on verbs. */
static void print_memlock(void)
{
  struct rlimit rl;
  if (getrlimit(RLIMIT_MEMLOCK, &rl))
    return;
  if (rl.rlim_cur == RLIM_INFINITY) {
    printf("  memlock limit:   unlimited\n");
    return;
  }
  printf("  memlock limit:   %llu KiB\n", (unsigned long long)rl.rlim_cur / 1024);
  if (rl.rlim_cur < (64u << 20))
    printf("  hint: registering more than %llu KiB will fail on verbs; raise it with "
           "'ulimit -l unlimited' (or memlock in /etc/security/limits.conf)\n",
           (unsigned long long)rl.rlim_cur / 1024);
}

#ifdef HAVE_IBVERBS
static const char *port_state(enum ibv_port_state s)
{
  switch (s) {
  case IBV_PORT_DOWN: return "DOWN";
  case IBV_PORT_INIT: return "INIT";
  case IBV_PORT_ARMED: return "ARMED";
  case IBV_PORT_ACTIVE: return "ACTIVE";
  case IBV_PORT_ACTIVE_DEFER: return "ACTIVE_DEFER";
  default: return "NOP";
  }
}

static void print_verbs(void)
{
  int n = 0;
  struct ibv_device **devs = ibv_get_device_list(&n);
  printf("\nverbs devices (rdma-core):\n");
  if (!devs || !n) {
    printf("  none: no RDMA device on this machine (Soft-RoCE: 'rdma link add rxe0 type rxe "
           "netdev IFACE')\n");
    print_memlock();
    if (devs)
      ibv_free_device_list(devs);
    return;
  }
  for (int d = 0; d < n; d++) {
    struct ibv_context *ctx = ibv_open_device(devs[d]);
    struct ibv_device_attr attr;
    printf("  %s", ibv_get_device_name(devs[d]));
    if (!ctx || ibv_query_device(ctx, &attr)) {
      printf(": cannot open (%s)\n", ctx ? "query failed" : "permission or driver problem");
      if (ctx)
        ibv_close_device(ctx);
      continue;
    }
    printf(": fw %s, %u port(s)\n", attr.fw_ver, attr.phys_port_cnt);
    for (uint8_t p = 1; p <= attr.phys_port_cnt; p++) {
      struct ibv_port_attr pa;
      if (ibv_query_port(ctx, p, &pa))
        continue;
      printf("    port %u: %s, link layer %s, active MTU %d\n", p, port_state(pa.state),
             pa.link_layer == IBV_LINK_LAYER_ETHERNET ? "Ethernet" : "InfiniBand",
             128 << pa.active_mtu);
      int gids = 0;
      for (int g = 0; g < pa.gid_tbl_len; g++) {
        struct ibv_gid_entry e;
        if (ibv_query_gid_ex(ctx, p, (uint32_t)g, &e, 0))
          continue;
        static const uint8_t zero[16];
        if (!memcmp(e.gid.raw, zero, 16))
          continue;
        char text[INET6_ADDRSTRLEN];
        inet_ntop(AF_INET6, e.gid.raw, text, sizeof text);
        printf("      gid[%d] %-40s %s\n", g, text,
               e.gid_type == IBV_GID_TYPE_ROCE_V2   ? "RoCE v2"
               : e.gid_type == IBV_GID_TYPE_ROCE_V1 ? "RoCE v1"
                                                    : "IB");
        gids++;
      }
      if (pa.state == IBV_PORT_DOWN || pa.state == IBV_PORT_INIT)
        printf("      hint: port is %s: check the cable or link (%s), or the subnet manager "
               "(InfiniBand)\n", port_state(pa.state),
               pa.link_layer == IBV_LINK_LAYER_ETHERNET ? "ip link" : "ibstat");
      if (!gids)
        printf("      hint: no GID: the network interface behind this port has no IP "
               "address (RoCE needs one)\n");
    }
    ibv_close_device(ctx);
  }
  ibv_free_device_list(devs);
  print_memlock();
}
#else
static void print_verbs(void)
{
  printf("\nverbs devices: not shown (xport_info was built without rdma-core)\n");
  print_memlock();
}
#endif

/* -a: every provider that opens, side by side. */
static int print_all(void)
{
  xport_ctx_t *ctx;
  const xport_candidate_t *cands;
  char names[16][32];
  xport_caps_t caps[16];
  int n = 0;
  setenv("XPORT_LOG", "none", 0); /* a provider that will not open is a column less */
  if (xport_ctx_create(NULL, &ctx) == 0) {
    int nc = xport_ctx_candidates(ctx, &cands);
    for (int i = 0; i < nc && n < 16; i++) {
      int dup = 0;
      for (int j = 0; j < n; j++)
        dup |= !strcmp(names[j], cands[i].provider);
      if (!dup)
        snprintf(names[n++], sizeof names[0], "%s", cands[i].provider);
    }
    xport_ctx_destroy(ctx);
  }
  int ok = 0;
  for (int i = 0; i < n; i++) {
    xport_ctx_attr_t a = {.provider = names[i]};
    if (xport_ctx_create(&a, &ctx))
      continue;
    xport_ctx_query(ctx, &caps[ok]);
    if (ok != i)
      memcpy(names[ok], names[i], sizeof names[0]);
    ok++;
    xport_ctx_destroy(ctx);
  }
  if (!ok) {
    fprintf(stderr, "xport_info: no provider opens\n");
    return 1;
  }
  char mr[96];
#define ROW(label, fmt, expr)                                                          \
  do {                                                                                 \
    printf("%-16s", label);                                                            \
    for (int i = 0; i < ok; i++) {                                                     \
      const xport_caps_t *c = &caps[i];                                                \
      (void)c;                                                                         \
      printf(" " fmt, expr);                                                           \
    }                                                                                  \
    printf("\n");                                                                      \
  } while (0)
  ROW("provider", "%-14s", c->provider);
  ROW("endpoint type", "%-14s", c->ep_type == XPORT_EP_RDM ? "rdm" : "msg");
  ROW("domain", "%-14s", c->domain);
  ROW("max message", "%-14zu", c->max_msg_size);
  ROW("inject size", "%-14zu", c->inject_size);
  ROW("max iov", "%-14zu", c->max_iov);
  ROW("tx/rx depth", "%-14s", (snprintf(mr, sizeof mr, "%zu/%zu", c->tx_depth, c->rx_depth), mr));
  ROW("imm bytes", "%-14u", c->wire_imm_bytes);
  ROW("rma", "%-14s", support_name(c->rma));
  ROW("write_imm", "%-14s", support_name(c->write_imm));
  ROW("atomics", "%-14s", support_name(c->atomics));
  ROW("registration", "%-14s", (mr_mode_str(c->mr_mode, mr, sizeof mr), mr));
  ROW("wait fd", "%-14s", c->wait_fd ? "yes" : "no");
  ROW("progress", "%-14s", c->progress == XPORT_PROGRESS_MANUAL ? "manual" : "auto");
#undef ROW
  return 0;
}

static void usage(FILE *f)
{
  fprintf(f, "usage: xport_info [-p PROVIDER] [-v] [--json] [-a] [-e] [-h]\n"
             "  -p PROVIDER  probe only this provider (same syntax as XPORT_PROVIDER)\n"
             "  -v           every candidate libfabric lists, rows that look alike included\n"
             "  --json       one JSON object: chosen and every candidate\n"
             "  -a           every provider that opens, side by side\n"
             "  -e           list every XPORT_* environment variable\n");
}

int main(int argc, char **argv)
{
  static const struct option opts[] = {{"json", no_argument, NULL, 'j'},
                                       {"help", no_argument, NULL, 'h'},
                                       {"verbose", no_argument, NULL, 'v'},
                                       {NULL, 0, NULL, 0}};
  xport_ctx_attr_t attr = {0};
  int json = 0, verbose = 0, ch;
  while ((ch = getopt_long(argc, argv, "p:veajh", opts, NULL)) != -1) {
    switch (ch) {
    case 'p': attr.provider = optarg; break;
    case 'e': return print_env();
    case 'a': return print_all();
    case 'v': verbose = 1; break;
    case 'j': json = 1; break;
    case 'h': usage(stdout); return 0;
    default: usage(stderr); return 2;
    }
  }
  xport_ctx_t *ctx;
  int rc = xport_ctx_create(&attr, &ctx);
  if (rc) {
    fprintf(stderr, "xport_info: %s\n", xport_strerror(rc));
    return 1;
  }
  xport_caps_t caps;
  const xport_candidate_t *cands;
  xport_ctx_query(ctx, &caps);
  int n = xport_ctx_candidates(ctx, &cands);
  if (json) {
    print_json(&caps, cands, n);
  } else {
    print_text(&caps, cands, n, verbose);
    print_verbs();
  }
  xport_ctx_destroy(ctx);
  return 0;
}
