/* xport_info: what the probe saw, what it chose and why, and the
 * environment variables xport reads. Uses only the public header. */
#include <xport.h>

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *verdict_name(xport_verdict_t v)
{
  return v == XPORT_VERDICT_CHOSEN ? "chosen" : v == XPORT_VERDICT_USABLE ? "usable" : "rejected";
}

static const char *support_name(xport_support_t s)
{
  return s == XPORT_SUPPORT_NATIVE ? "native" : s == XPORT_SUPPORT_EMULATED ? "emulated" : "none";
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

static void print_text(const xport_caps_t *c, const xport_candidate_t *cands, int n)
{
  char mr[96];
  printf("candidates (in rank order):\n");
  for (int i = 0; i < n; i++)
    printf("  %-8s %-12s %-10s %-18s %s\n", verdict_name(cands[i].verdict), cands[i].provider,
           cands[i].domain, cands[i].fabric, cands[i].reason);
  mr_mode_str(c->mr_mode, mr, sizeof mr);
  printf("\nchosen:\n"
         "  provider:        %s\n  fabric:          %s\n  domain:          %s\n"
         "  endpoint type:   %s\n  max message:     %zu\n  inject size:     %zu\n"
         "  max iov:         %zu\n  tx/rx depth:     %zu/%zu\n"
         "  immediate data:  %u bits (provider carries %u bytes)\n"
         "  rma:             %s\n  atomics:         %s\n  registration:    %s\n"
         "  wait fd:         %s\n  progress:        %s%s\n  strict mode:     %s\n",
         c->provider, c->fabric, c->domain, c->ep_type == XPORT_EP_RDM ? "rdm" : "msg",
         c->max_msg_size, c->inject_size, c->max_iov, c->tx_depth, c->rx_depth, c->imm_bits,
         c->wire_imm_bytes, support_name(c->rma), support_name(c->atomics), mr,
         c->wait_fd ? "yes" : "no", c->progress == XPORT_PROGRESS_MANUAL ? "manual" : "auto",
         c->progress_thread ? " (progress thread on)" : "", c->strict ? "on" : "off");
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
         "\"rma\":\"%s\",\"atomics\":\"%s\",\"mr_mode\":\"%s\",\"wait_fd\":%s,"
         "\"progress\":\"%s\",\"strict\":%s},\"candidates\":[",
         c->ep_type == XPORT_EP_RDM ? "rdm" : "msg", c->max_msg_size, c->inject_size,
         c->max_iov, c->tx_depth, c->rx_depth, c->imm_bits, c->wire_imm_bytes,
         support_name(c->rma), support_name(c->atomics), mr, c->wait_fd ? "true" : "false",
         c->progress == XPORT_PROGRESS_MANUAL ? "manual" : "auto", c->strict ? "true" : "false");
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

static void usage(FILE *f)
{
  fprintf(f, "usage: xport_info [-p PROVIDER] [--json] [-e] [-h]\n"
             "  -p PROVIDER  probe only this provider (same syntax as XPORT_PROVIDER)\n"
             "  --json       one JSON object: chosen and candidates\n"
             "  -e           list every XPORT_* environment variable\n");
}

int main(int argc, char **argv)
{
  static const struct option opts[] = {{"json", no_argument, NULL, 'j'},
                                       {"help", no_argument, NULL, 'h'},
                                       {NULL, 0, NULL, 0}};
  xport_ctx_attr_t attr = {0};
  int json = 0, ch;
  while ((ch = getopt_long(argc, argv, "p:ejh", opts, NULL)) != -1) {
    switch (ch) {
    case 'p': attr.provider = optarg; break;
    case 'e': return print_env();
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
  if (json)
    print_json(&caps, cands, n);
  else
    print_text(&caps, cands, n);
  xport_ctx_destroy(ctx);
  return 0;
}
