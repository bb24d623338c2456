/* Writes the fuzz targets' seed corpus (make fuzz-corpus): messages as
 * xport sends them. Remote keys are packed by xport_rkey_pack(3) itself,
 * from registrations on every provider here, alone and with shm beside
 * (two-part blobs); control messages, greetings and service-channel
 * messages are laid out as rdm.c and msg.c write them, each type of each.
 * Usage: gen-corpus DIR   (writes DIR/<target>/<name>) */
#include <xport.h>
#include "transport/msg_wire.h"
#include "transport/rdm_wire.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Kept in step with fuzz_msg_svc.c's registration. */
#define FUZZ_PAGE_AT 0x7e5500000000ULL
#define FUZZ_KEY_WHOLE 0x1111
#define FUZZ_KEY_SPAN 0x2222
#define FUZZ_SPAN_OFF 64

static const char *top;
static int failed;

static void put(const char *target, const char *name, const void *buf, size_t len)
{
  char path[4096];
  snprintf(path, sizeof path, "%s/%s", top, target);
  if (mkdir(path, 0777) && errno != EEXIST) {
    perror(path);
    failed = 1;
    return;
  }
  snprintf(path, sizeof path, "%s/%s/%s", top, target, name);
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(buf, 1, len, f) != len || fclose(f)) {
    perror(path);
    failed = 1;
  }
}

static void le(uint8_t *p, uint64_t v, int n)
{
  for (int i = 0; i < n; i++)
    p[i] = (uint8_t)(v >> (8 * i));
}

/* Keys of a context on provider (shm beside it or not), as one blob. */
static void rkeys(const char *provider, const char *shm, const char *name)
{
  static _Alignas(64) char buf[4096];
  xport_ctx_t *ctx;
  xport_mr_t *mr;
  uint8_t blob[XPORT_RKEY_MAX_SIZE];
  setenv("XPORT_PROVIDER", provider, 1);
  setenv("XPORT_SHM", shm, 1);
  if (xport_ctx_create(NULL, &ctx)) {
    fprintf(stderr, "gen-corpus: no %s here: its keys are left out\n", provider);
    return;
  }
  if (!xport_mr_reg(ctx, buf, sizeof buf,
                    XPORT_ACCESS_LOCAL | XPORT_ACCESS_REMOTE_READ | XPORT_ACCESS_REMOTE_WRITE |
                        XPORT_ACCESS_REMOTE_ATOMIC,
                    &mr)) {
    char file[128];
    int n = xport_rkey_pack(mr, 0, sizeof buf, blob, sizeof blob);
    snprintf(file, sizeof file, "%s-whole", name);
    if (n > 0)
      put("rkey", file, blob, (size_t)n);
    n = xport_rkey_pack(mr, 100, 28, blob, sizeof blob); /* a span of its own */
    snprintf(file, sizeof file, "%s-span", name);
    if (n > 0)
      put("rkey", file, blob, (size_t)n);
    xport_mr_dereg(mr);
  }
  xport_ctx_destroy(ctx);
}

static void ctl(uint32_t type, const char *name)
{
  struct xport__ctl m;
  memset(&m, 0, sizeof m);
  m.magic = XPORT__CTL_MAGIC;
  m.version = XPORT__CTL_VERSION;
  m.type = type;
  m.ctx_id = 0x1d2c3b4a59687766ULL;
  m.src_id = 3;
  m.dst_id = type == XPORT__CTL_CONNREQ ? 0 : 7;
  m.cookie = type == XPORT__CTL_CONNREQ ? 0 : 0x0123456789abcdefULL & XPORT__TAG_MASK;
  m.tag = type == XPORT__CTL_CHALLENGE ? 0x3c5a7e9f1b2d4f6ULL : 0x2468ace013579bdfULL & XPORT__TAG_MASK;
  m.pid = (uint32_t)getpid();
  m.pidns = 4026531836ULL;
  snprintf(m.boot_id, sizeof m.boot_id, "%s", "6f1c2b8e-4d3a-4e5f-9a7b-1c2d3e4f5a6b");
  if (type == XPORT__CTL_CONNREQ) {
    const char addr[] = "fi_shm://12345:0:1"; /* shm names its endpoints so */
    memcpy(m.addr, addr, sizeof addr);
    m.addrlen = sizeof addr;
  }
  put("rdm_ctl", name, &m, sizeof m);
  if (type == XPORT__CTL_CONNREQ) { /* the request again, with its challenge's token */
    m.cookie = 0x5a5a5a5a12345678ULL;
    put("rdm_ctl", "connreq-token", &m, sizeof m);
    m.cookie = 0; /* ... and with the user's data (xport_connect_data) */
    m.datalen = 6;
    memcpy(m.data, "rank 7", 6);
    put("rdm_ctl", "connreq-data", &m, sizeof m);
  }
}

static void hello(uint32_t flags, uint64_t cookie, const char *name)
{
  struct xport__hello h = {.magic = HELLO_MAGIC, .version = HELLO_VERSION,
                           .ctx_id = 0x1d2c3b4a59687766ULL, .flags = flags, .cookie = cookie};
  put("msg_hello", name, &h, sizeof h);
}

static void svc_req(unsigned kind, uint64_t key, uint64_t addr, const char *name)
{
  uint8_t m[ATOM_REQ_LEN];
  le(m, ATOM_REQ_MAGIC, 4);
  le(m + 4, kind, 4);
  le(m + 8, 42, 4);
  le(m + 12, 0, 4);
  le(m + 16, key, 8);
  le(m + 24, addr, 8);
  le(m + 32, 5, 8);
  le(m + 40, 0x0f0e0d0c0b0a0908ULL, 8);
  put("msg_svc", name, m, sizeof m);
}

int main(int argc, char **argv)
{
  if (argc != 2) {
    fprintf(stderr, "usage: gen-corpus DIR\n");
    return 2;
  }
  top = argv[1];
  rkeys("shm", "off", "shm");
  rkeys("tcp", "off", "tcp");
  rkeys("tcp;ofi_rxm", "off", "rxm");
  rkeys("tcp", "auto", "tcp+shm");
  rkeys("tcp;ofi_rxm", "auto", "rxm+shm");

  ctl(XPORT__CTL_CONNREQ, "connreq");
  ctl(XPORT__CTL_CONNACK, "connack");
  ctl(XPORT__CTL_CONNREJ, "connrej");
  ctl(XPORT__CTL_DISC, "disc");
  ctl(XPORT__CTL_KEEPALIVE, "keepalive");
  ctl(XPORT__CTL_PING, "ping");
  ctl(XPORT__CTL_PONG, "pong");
  ctl(XPORT__CTL_CHALLENGE, "challenge");

  hello(0, 0, "connect");
  hello(HELLO_WANT_SVC, 0, "connect-want-svc");
  hello(HELLO_DATA, 0, "connect-data");
  hello(0, 0x77665544332211ULL, "accept-svc-cookie");
  hello(HELLO_SVC, 0x77665544332211ULL, "svc-connect");

  /* Kinds 1 fetch-add, 2 cswap, 3 add; by offset and by address. */
  svc_req(1, FUZZ_KEY_WHOLE, 8, "fadd-offset");
  svc_req(2, FUZZ_KEY_WHOLE, FUZZ_PAGE_AT + 4096 + 16, "cswap-address");
  svc_req(3, FUZZ_KEY_SPAN, 8, "add-span-offset");
  svc_req(1, FUZZ_KEY_SPAN, FUZZ_PAGE_AT + 4096 + FUZZ_SPAN_OFF, "fadd-span-address");
  uint8_t ans[ATOM_ANS_LEN] = {0};
  le(ans, ATOM_ANS_MAGIC, 4);
  le(ans + 8, 42, 4);
  le(ans + 16, 1234, 8);
  put("msg_svc", "answer", ans, sizeof ans);
  le(ans + 4, (uint32_t)-13, 4); /* a refusal */
  put("msg_svc", "answer-refused", ans, sizeof ans);
  return failed;
}
