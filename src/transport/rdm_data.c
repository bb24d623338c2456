/* The RDM data path: one endpoint for many connections, so the tag
 * picks the connection. */
#include "rdm.h"
#include "rdm_wire.h"
#include "fi_rma.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

/* ---- the data path -------------------------------------------------------
 * One endpoint for many connections: the tag picks the connection, the
 * peer's receive tag on sends, ours on receives, which only the two ends
 * know. */

static ssize_t rdm_send(xport_conn_t *conn, struct xport__req *req, struct iovec *iov,
                        void **desc, size_t cnt, uint64_t flags, uint64_t data)
{
  if (XPORT__UNLIKELY(flags)) {
    /* An empty message carries no scatter element. */
    struct fi_msg_tagged msg = {.msg_iov = iov, .desc = desc, .iov_count = req->len ? cnt : 0,
                                .addr = rconn(conn)->dest, .tag = rconn(conn)->tag,
                                .context = &req->fictx, .data = data};
    return fi_tsendmsg(conn->ep, &msg, flags);
  }
  if (cnt == 1)
    return fi_tsend(conn->ep, iov[0].iov_base, iov[0].iov_len, desc[0], rconn(conn)->dest,
                    rconn(conn)->tag, &req->fictx);
  return fi_tsendv(conn->ep, iov, desc, cnt, rconn(conn)->dest, rconn(conn)->tag, &req->fictx);
}

static ssize_t rdm_inject(xport_conn_t *conn, const void *buf, size_t len, int with_imm,
                          uint32_t imm)
{
  if (with_imm)
    return fi_tinjectdata(conn->ep, buf, len, imm, rconn(conn)->dest, rconn(conn)->tag);
  return fi_tinject(conn->ep, buf, len, rconn(conn)->dest, rconn(conn)->tag);
}

/* Ignoring the write_imm bit lets an emulated write_imm's message
 * consume a receive like any other (the portable rule). */
static ssize_t rdm_recv(xport_conn_t *conn, struct xport__req *req, struct iovec *iov,
                        void **desc, size_t cnt)
{
  if (cnt == 1)
    return fi_trecv(conn->ep, iov[0].iov_base, iov[0].iov_len, desc[0], rconn(conn)->rx_src,
                    rconn(conn)->rx_tag, XPORT__WIMM_TAG, &req->fictx);
  return fi_trecvv(conn->ep, iov, desc, cnt, rconn(conn)->rx_src, rconn(conn)->rx_tag,
                   XPORT__WIMM_TAG, &req->fictx);
}

/* truncation_hangs: room behind the caller's buffer for the rest of a
 * longer message; the completion then says ETRUNC. */
static ssize_t rdm_recv_sunk(xport_conn_t *conn, struct xport__req *req, struct iovec *iov,
                             void **desc, size_t cnt)
{
  iov[cnt].iov_base = conn->lane->sink;
  iov[cnt].iov_len = conn->lane->sink_len;
  desc[cnt] = NULL;
  return fi_trecvv(conn->ep, iov, desc, cnt + 1, rconn(conn)->rx_src, rconn(conn)->rx_tag,
                   XPORT__WIMM_TAG, &req->fictx);
}

/* The marker rides a tag bit, not the CQ data: some RDM providers carry
 * only 4 bytes of it (verbs;ofi_rxm). Where a message that came before
 * its receive must bear the receive's very tag (unexpected_tag_exact:
 * shm), it rides the upper half of the CQ data, as over MSG, which those
 * providers carry whole. */
static ssize_t rdm_marker(xport_conn_t *conn, struct xport__req *req, uint64_t flags)
{
  int in_data = conn->lane->prof && conn->lane->prof->unexpected_tag_exact;
  struct fi_msg_tagged tm = {
      .msg_iov = NULL, .desc = NULL, .iov_count = 0, .addr = rconn(conn)->dest,
      .tag = rconn(conn)->tag | (in_data ? 0 : XPORT__WIMM_TAG), .context = &req->fictx,
      .data = in_data ? XPORT__WIMM_MARK << 32 | req->imm : req->imm};
  return fi_tsendmsg(conn->ep, &tm, FI_REMOTE_CQ_DATA | flags);
}

/* Either mark: a user's immediate data has 32 bits, none in the upper
 * half. */
static int rdm_is_marker(const struct fi_cq_data_entry *e)
{
  return (((const struct fi_cq_tagged_entry *)(const void *)e)->tag & XPORT__WIMM_TAG) ||
         (e->data >> 32) == XPORT__WIMM_MARK;
}

static ssize_t rdm_read(xport_conn_t *conn, struct xport__req *req, struct iovec *iov,
                        void **desc, size_t cnt, uint64_t addr, uint64_t key)
{
  return xport__fi_read(conn->ep, rconn(conn)->dest, req, iov, desc, cnt, addr, key);
}

static ssize_t rdm_write(xport_conn_t *conn, struct xport__req *req, struct iovec *iov,
                         void **desc, size_t cnt, uint64_t addr, uint64_t key, uint64_t flags,
                         uint64_t data)
{
  return xport__fi_write(conn->ep, rconn(conn)->dest, req, iov, desc, cnt, addr, key, flags,
                         data);
}

static ssize_t rdm_atomic_op(xport_conn_t *conn, struct xport__req *req, unsigned kind,
                             uint64_t *v, void *desc, uint64_t addr, uint64_t key)
{
  return xport__fi_atomic(conn->ep, rconn(conn)->dest, req, kind, v, desc, addr, key);
}

const struct xport__data_ops rdm_data = {
    .send = rdm_send,
    .inject = rdm_inject,
    .recv = rdm_recv,
    .marker = rdm_marker,
    .is_marker = rdm_is_marker,
    .read = rdm_read,
    .write = rdm_write,
    .atomic = rdm_atomic_op,
};
static const struct xport__data_ops rdm_data_sunk = {
    .send = rdm_send,
    .inject = rdm_inject,
    .recv = rdm_recv_sunk,
    .marker = rdm_marker,
    .is_marker = rdm_is_marker,
    .read = rdm_read,
    .write = rdm_write,
    .atomic = rdm_atomic_op,
};
static const struct xport__data_ops rdm_data_claimed = {
    .send = rdm_send,
    .inject = rdm_inject,
    .recv = rdm_recv_claimed,
    .marker = rdm_marker,
    .is_marker = rdm_is_marker,
    .read = rdm_read,
    .write = rdm_write,
    .atomic = rdm_atomic_op,
};

void rdm_ops_plain(xport_conn_t *conn)
{
  conn->ops = conn->lane->sink ? &rdm_data_sunk : &rdm_data;
}

void rdm_ops_claimed(xport_conn_t *conn)
{
  conn->ops = &rdm_data_claimed;
}
