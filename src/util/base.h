/* What every file of libxport uses: branch hints, assertions, intrusive
 * lists, the clock, bounded copies, little-endian fields. */
#ifndef XPORT_UTIL_BASE_H
#define XPORT_UTIL_BASE_H

#define XPORT_BUILDING 1 /* xport.h: XPORT_API exports */

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include "xport.h"

#define XPORT__UNLIKELY(x) __builtin_expect(!!(x), 0)
#define XPORT__LIKELY(x) __builtin_expect(!!(x), 1)

/* An invariant the code relies on (and a comment states), checked where
 * the library was configured with --enable-asserts (the sanitizer
 * builds): a broken one aborts with where and what. Free otherwise. */
#ifdef XPORT_ASSERTS
void xport__assert_fail(const char *what, const char *file, int line)
    __attribute__((noreturn));
#define XPORT__ASSERT(cond)                                                  \
  do {                                                                       \
    if (XPORT__UNLIKELY(!(cond)))                                            \
      xport__assert_fail(#cond, __FILE__, __LINE__);                         \
  } while (0)
#else
#define XPORT__ASSERT(cond) ((void)0)
#endif

/* Intrusive doubly linked lists (requests, connections, listeners,
 * registrations): push at the head, and unlink, through the fields named. */
#define XPORT__LIST_PUSH(head, node, next, prev)                                             \
  do {                                                                                      \
    (node)->prev = NULL;                                                                    \
    (node)->next = (head);                                                                  \
    if (head)                                                                               \
      (head)->prev = (node);                                                                \
    (head) = (node);                                                                        \
  } while (0)
/* Singly linked queues (done requests, events, backlogs): append at the
 * tail through the field named. */
#define XPORT__FIFO_PUSH(head, tail, node, next)                                             \
  do {                                                                                      \
    (node)->next = NULL;                                                                    \
    if (tail)                                                                               \
      (tail)->next = (node);                                                                \
    else                                                                                    \
      (head) = (node);                                                                      \
    (tail) = (node);                                                                        \
  } while (0)
#define XPORT__LIST_UNLINK(head, node, next, prev)                                           \
  do {                                                                                      \
    if ((node)->prev)                                                                       \
      (node)->prev->next = (node)->next;                                                    \
    else                                                                                    \
      (head) = (node)->next;                                                                \
    if ((node)->next)                                                                       \
      (node)->next->prev = (node)->prev;                                                    \
  } while (0)

static inline long xport__now_ms(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1000L + ts.tv_nsec / 1000000L;
}

static inline void xport__strlcpy(char *dst, const char *src, size_t len)
{
  size_t n = 0;
  if (src)
    for (; n + 1 < len && src[n]; n++)
      dst[n] = src[n];
  dst[n] = '\0';
}

/* Little-endian fields of xport's own formats (packed keys, service
 * channel messages): the same bytes on every host. */
static inline void xport__put16(uint8_t *p, uint16_t v)
{
  p[0] = (uint8_t)v;
  p[1] = (uint8_t)(v >> 8);
}
static inline void xport__put32(uint8_t *p, uint32_t v)
{
  for (int i = 0; i < 4; i++)
    p[i] = (uint8_t)(v >> (8 * i));
}
static inline void xport__put64(uint8_t *p, uint64_t v)
{
  for (int i = 0; i < 8; i++)
    p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint16_t xport__get16(const uint8_t *p) { return (uint16_t)(p[0] | p[1] << 8); }
static inline uint32_t xport__get32(const uint8_t *p)
{
  uint32_t v = 0;
  for (int i = 3; i >= 0; i--)
    v = v << 8 | p[i];
  return v;
}
static inline uint64_t xport__get64(const uint8_t *p)
{
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--)
    v = v << 8 | p[i];
  return v;
}

#endif /* XPORT_UTIL_BASE_H */
