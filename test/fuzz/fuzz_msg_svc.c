/* libFuzzer target: service-channel requests and answers (msg_wire.h),
 * as msg.c sorts what arrives on a channel and applies an atomic a peer
 * asks for to this side's memory. Whatever the bytes, nothing outside a
 * registration the request's key names, with the atomic right, is read
 * or written: the registration is a page between two inaccessible ones,
 * one key names it whole and another a span inside it, and every byte
 * of the page outside what the key names is checked unchanged.
 *
 * Input: the message as it travels; requests are applied twice, with
 * addresses as offsets and as virtual addresses (the page is mapped at a
 * fixed address, so that the corpus can name it). */
#include "xport_int.h"
#include "transport/msg_wire.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Kept in step with gen-corpus.c, which writes requests for them. */
#define FUZZ_PAGE_AT 0x7e5500000000ULL
#define FUZZ_KEY_WHOLE 0x1111
#define FUZZ_KEY_SPAN 0x2222
#define FUZZ_KEY_NOATOMIC 0x3333
#define FUZZ_SPAN_OFF 64
#define FUZZ_SPAN_LEN 16

static xport_ctx_t ctx;
static struct xport__lane lane; /* the context's one lane */
static xport_mr_t mr, mr2;
static struct fid_mr fmr, fmr2, fspan;
static struct xport__span span;
static uint8_t *page, shadow[4096];
static size_t pagesz;

static void setup(void)
{
  pagesz = (size_t)sysconf(_SC_PAGESIZE);
  if (pagesz > sizeof shadow)
    abort();
  uint8_t *at = mmap((void *)(uintptr_t)FUZZ_PAGE_AT, 3 * pagesz, PROT_NONE,
                     MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
  if (at == MAP_FAILED || mprotect(at + pagesz, pagesz, PROT_READ | PROT_WRITE))
    abort();
  page = at + pagesz;
  fmr.key = FUZZ_KEY_WHOLE;
  fspan.key = FUZZ_KEY_SPAN;
  span.mr = &fspan;
  span.offset = FUZZ_SPAN_OFF;
  span.len = FUZZ_SPAN_LEN;
  lane.ctx = &ctx;
  mr.ctx = &ctx;
  mr.lane = &lane;
  mr.mr = &fmr;
  mr.base = (char *)page;
  mr.len = pagesz;
  mr.access = XPORT__ACCESS_REMOTE;
  mr.spans = &span;
  mr.nspans = 1;
  /* The same page again under a key without the atomic right. */
  fmr2.key = FUZZ_KEY_NOATOMIC;
  mr2 = mr;
  mr2.mr = &fmr2;
  mr2.spans = NULL;
  mr2.nspans = 0;
  mr2.access = XPORT_ACCESS_REMOTE_READ | XPORT_ACCESS_REMOTE_WRITE;
  mr.next = &mr2;
  ctx.mrs = &mr;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
  if (!page)
    setup();
  uint8_t *msg = malloc(size ? size : 1); /* a read past it is reported */
  if (!msg)
    return 0;
  memcpy(msg, data, size);
  int kind = xport__svc_kind(msg, size);
  if (kind && size != (kind == XPORT__SVC_REQUEST ? ATOM_REQ_LEN : ATOM_ANS_LEN))
    abort();
  for (int virt = 0; kind == XPORT__SVC_REQUEST && virt < 2; virt++) {
    lane.virt_addr = virt;
    for (size_t i = 0; i < pagesz; i++)
      page[i] = shadow[i] = (uint8_t)(i * 7 + 3);
    uint64_t old = 0;
    int ret = xport__svc_apply(&lane, msg, &old);
    uint64_t key = xport__get64(msg + 16);
    size_t lo = 0, hi = 0; /* what the key may touch */
    if (!ret && key == FUZZ_KEY_WHOLE) {
      hi = pagesz;
    } else if (!ret && key == FUZZ_KEY_SPAN) {
      lo = FUZZ_SPAN_OFF;
      hi = FUZZ_SPAN_OFF + FUZZ_SPAN_LEN;
    } else if (!ret) {
      abort(); /* applied under a key with no atomic right, or none */
    }
    if (ret && ret != -XPORT_EACCES && ret != -XPORT_EPROTO)
      abort();
    for (size_t i = 0; i < pagesz; i++)
      if (page[i] != shadow[i] && (i < lo || i >= hi))
        abort();
  }
  free(msg);
  return 0;
}
