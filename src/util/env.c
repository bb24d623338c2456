/* Every XPORT_* environment variable, declared once. xport_env_list()
 * hands this table to xport_info -e, so the documentation cannot drift. */
#include "xport_int.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const xport_env_var_t env_table[XPORT__ENV_COUNT] = {
  [XPORT__ENV_PROVIDER] = {"XPORT_PROVIDER", "string", "verbs,tcp",
    "Ordered, comma-separated providers to try (e.g. \"tcp\", "
    "\"verbs,tcp\"); a leading ^ excludes the listed ones instead. "
    "Providers marked explicit-only (sockets) are used only when named."},
  [XPORT__ENV_DOMAIN] = {"XPORT_DOMAIN", "string", "(any)",
    "Use only this libfabric domain (device), e.g. mlx5_0 or rxe0."},
  [XPORT__ENV_IFACE] = {"XPORT_IFACE", "string", "(any)",
    "Use only domains on this network interface, e.g. eth0 or lo. A "
    "provider without one (shm, which reaches this node only) is not "
    "filtered by it."},
  [XPORT__ENV_LOG] = {"XPORT_LOG", "string", "warn",
    "Log level on stderr: none, error, warn, info or debug."},
  [XPORT__ENV_STRICT] = {"XPORT_STRICT", "bool", "0",
    "Act as if the provider required FI_MR_LOCAL, virtual addresses, "
    "provider keys and FI_RX_CQ_DATA, as verbs does; for testing verbs "
    "code paths on tcp."},
  [XPORT__ENV_PROGRESS_THREAD] = {"XPORT_PROGRESS_THREAD", "bool", "0",
    "Start a thread that drives the provider's progress while the "
    "application is not polling (needed on tcp and shm for one-sided "
    "operations to reach a target that is busy elsewhere); it also keeps "
    "heartbeats going (XPORT_KEEPALIVE)."},
  [XPORT__ENV_EAGER_SIZE] = {"XPORT_EAGER_SIZE", "size", "8192",
    "Where local registration is required, unregistered messages up to "
    "this size are copied through pre-registered buffers; larger ones "
    "are registered for the duration of the operation. 0 copies nothing; "
    "values above 1M are taken as 1M."},
  [XPORT__ENV_XSHM_CMA] = {"XPORT_XSHM_CMA", "bool", "1",
    "xshm (XPORT_PROVIDER=xshm): copy messages longer than 8 KiB straight from "
    "the sender's memory by cross-memory attach (process_vm_readv), where the "
    "kernel lets the peers do it (same user; Yama ptrace_scope 0). 0, or a peer "
    "that may not: they travel through the ring in pieces, one copy more, and "
    "one-sided operations fail with XPORT_EIO."},
  [XPORT__ENV_OP_TIMEOUT] = {"XPORT_OP_TIMEOUT", "size", "0",
    "The deadline in milliseconds of every connection's operations, as "
    "xport_conn_timeout(3) sets it: a connection with sends, writes, reads "
    "or atomics outstanding and none of its operations ending for that "
    "long (a peer that hangs, or stopped serving it) is lost, and they fail "
    "with XPORT_ETIMEDOUT. 0: never."},
  [XPORT__ENV_POOL_LEND] = {"XPORT_POOL_LEND", "size", "4",
    "The most receives of a context's shared pool (xport_recv_shared(3)) "
    "one connection holds at a time, posted on it and waiting for its "
    "messages: one when it joins, one more per message it takes, up to this "
    "and its share of the pool; it takes the next as one ends. 1 to the "
    "connection's receive depth. More lets a connection's burst land without waiting for the "
    "application to post again; a pool of at least this many per "
    "connection keeps every connection ready. Read when the pool starts."},
  [XPORT__ENV_PEER_TIMEOUT] = {"XPORT_PEER_TIMEOUT", "size", "500",
    "On providers that never report a dead peer (shm, tcp;ofi_rxm), the "
    "time in milliseconds within which xport notices it: a peer process "
    "that is gone (same node); heartbeats have XPORT_KEEPALIVE_TIMEOUT "
    "instead (see XPORT_KEEPALIVE). Its operations then fail and its connection reports "
    "the disconnect. On rxm it also bounds how long closing waits for a "
    "peer's answer to its goodbye."},
  [XPORT__ENV_RMA_TIMEOUT] = {"XPORT_RMA_TIMEOUT", "size", "5000",
    "On providers where a one-sided operation that the target refuses "
    "(revoked or forged key) neither completes nor fails (shm), the time "
    "in milliseconds after which xport asks the target whether it has "
    "taken the operation off its queue. Only a target that answers while "
    "the operation is still unanswered has refused it: that connection is "
    "lost with EACCES and the endpoint's others with ECONNRESET, since the "
    "provider holds up the endpoint's later answers. A target that is "
    "busy outside xport is waited for; 0 never asks."},
  [XPORT__ENV_WAIT_FD] = {"XPORT_WAIT_FD", "bool", "1",
    "Open the completion queue with a wait file descriptor, so that "
    "xport_wait sleeps in the kernel and xport_ctx_fd works. 0 suits "
    "applications that only poll: on tcp it saves about a microsecond per "
    "round trip, and xport_wait then sleeps in short steps instead."},
  [XPORT__ENV_KEEPALIVE] = {"XPORT_KEEPALIVE", "string", "auto",
    "Heartbeats between the two ends of connections over shm and rxm, so "
    "that a peer that died or hangs is noticed within XPORT_KEEPALIVE_TIMEOUT. "
    "auto: only where the peer's process cannot be watched (another node "
    "or another PID namespace); 1: always; 0: never."},
  [XPORT__ENV_DELIVERY_COMPLETE] = {"XPORT_DELIVERY_COMPLETE", "bool", "0 (1 on tcp;ofi_rxm)",
    "1: a one-sided write (xport_write, xport_writev, xport_write_imm) "
    "completes only once its data has reached the target's memory, and "
    "fails if the target dies first, as on verbs RC. 0: on tcp, shm and "
    "the rxm providers a write completes once the transport has taken "
    "its data (the source buffer may be reused), which says nothing about "
    "the target. Costs a round trip per write where the provider must "
    "acknowledge it (tcp, rxm over tcp, shm). On by default over "
    "tcp;ofi_rxm, which otherwise hides a write the target refused (a "
    "revoked key) and the messages lost with it."},
  [XPORT__ENV_LISTEN_BACKLOG] = {"XPORT_LISTEN_BACKLOG", "size", "128",
    "How many connection requests a listener holds while the application "
    "has not accepted them, as listen(2)'s backlog; requests beyond it, "
    "and those still waiting when the listener closes, are refused "
    "(ECONNREFUSED at the client)."},
  [XPORT__ENV_KEEPALIVE_TIMEOUT] = {"XPORT_KEEPALIVE_TIMEOUT", "size", "30000",
    "Where heartbeats run (XPORT_KEEPALIVE), the time in milliseconds after "
    "which a peer from which nothing was heard is taken for dead: its "
    "operations fail and its connection reports the disconnect. A process "
    "answers heartbeats only inside xport (xport_poll, xport_wait) or with "
    "its progress thread on: make it longer than the longest time a peer "
    "computes outside xport, or run the progress thread there."},
  [XPORT__ENV_JOB] = {"XPORT_JOB", "string", "auto",
    "How xport_job_init(3) finds its job. auto: through the launcher's "
    "PMIx server (mpirun, srun --mpi=pmix) when one started the process, "
    "else a job of one rank; pmix: a launcher is required, and its absence "
    "is an error that names the variables a launcher sets; single: a job "
    "of one rank, whatever started it."},
  [XPORT__ENV_JOB_HOST] = {"XPORT_JOB_HOST", "string", "(the provider's address)",
    "The host (name or address) at which a job's rank listens and which it "
    "publishes to its peers; by default the address of the network the "
    "context's provider opened, or 127.0.0.1 where it has none (shm)."},
  [XPORT__ENV_JOB_TIMEOUT] = {"XPORT_JOB_TIMEOUT", "size", "60000",
    "Milliseconds xport_job_conn(3) waits for a connection to a rank, and "
    "after which a fence (xport_job_init, xport_job_barrier, xport_job_fini) "
    "still waiting says so in the log."},
  [XPORT__ENV_SHM] = {"XPORT_SHM", "string", "auto",
    "Whether peers on this node are reached over shared memory. auto: a "
    "context whose fabric (XPORT_PROVIDER) is not of this node opens xport's "
    "own shared memory (xshm) beside it, or libfabric's shm where xshm "
    "cannot open; it listens on both under one host:port, and xport_connect "
    "reaches a listener on this node (same network and PID namespace, same "
    "user, another process) over shared memory and every other peer over "
    "the fabric; xshm: xshm beside the fabric, never libfabric's shm; "
    "libfabric: libfabric's shm beside the fabric (same /dev/shm, same PID "
    "namespace); off: the fabric only; only: shared memory only, as "
    "XPORT_PROVIDER=xshm. 0/no/false mean off, 1/yes/true/on auto; any "
    "other value warns and means off."},
  [XPORT__ENV_FAULT] = {"XPORT_FAULT", "string", "(none)",
    "Fault injection, for tests: comma-separated rules, each NAME:N. "
    "mr_reg:N: the process's Nth xport_mr_reg fails with XPORT_ENOMEM; "
    "drop_conn:N: every connection is lost after N posts, as if its peer "
    "had died (operations end with XPORT_ECONNRESET, then the disconnect "
    "event), and the peer loses it too; delay_ms:N: xport_poll holds each "
    "completion N ms after it found it, in order; eagain:N (N >= 2): every "
    "Nth post (send, receive, write, read, atomic) fails with XPORT_EAGAIN "
    "and posts nothing. Read when a context is created; a malformed value "
    "makes xport_ctx_create fail with XPORT_EINVAL."},
  [XPORT__ENV_AUTH_KEY_FILE] = {"XPORT_AUTH_KEY_FILE", "string", "(none)",
    "A file whose bytes (16 or more) are a key shared by every process "
    "that may connect: each connection then proves it both ways before it "
    "is made, and a peer without it is refused (EACCES). The file must be "
    "a regular file of this user that group and others cannot access (chmod "
    "600), or the context is not created. xport_ctx_attr_t.auth_key beats "
    "it. Unset: no key; connections are then not authenticated. The ranks "
    "of a job share one such file (mpirun -x XPORT_AUTH_KEY_FILE)."},
  [XPORT__ENV_RECV_AHEAD] = {"XPORT_RECV_AHEAD", "size", "0",
    "On providers that keep a message that arrives before its receive in "
    "memory of their own, without bound (tcp;ofi_rxm, verbs;ofi_rxm), how "
    "many such messages a connection's peer may have sent ahead of the "
    "receives posted for them; the next one ends the connection (both "
    "sides get the disconnect, outstanding operations fail with "
    "ECONNRESET) and is discarded with those held. 0: no bound (the "
    "receiver's memory grows with them; a peer that streams faster than "
    "the receiver posts is then slowed by nothing). Other providers hold "
    "such messages in the peer's send queue or socket buffers, or fail "
    "the sender (verbs), and ignore it."},
};

XPORT_API int xport_env_list(const xport_env_var_t **vars_p)
{
  if (!vars_p)
    return -XPORT_EINVAL;
  *vars_p = env_table;
  return XPORT__ENV_COUNT;
}

const char *xport__env_str(enum xport__env_id id)
{
  const char *v = getenv(env_table[id].name);
  return (v && *v) ? v : NULL;
}

int xport__env_bool(enum xport__env_id id, int def)
{
  const char *v = xport__env_str(id);
  if (!v)
    return def;
  if (!strcmp(v, "1") || !strcasecmp(v, "yes") || !strcasecmp(v, "true") ||
      !strcasecmp(v, "on"))
    return 1;
  if (!strcmp(v, "0") || !strcasecmp(v, "no") || !strcasecmp(v, "false") ||
      !strcasecmp(v, "off"))
    return 0;
  XPORT__WARN("%s=%s is not a boolean; using %d", env_table[id].name, v, def);
  return def;
}

size_t xport__env_size(enum xport__env_id id, size_t def)
{
  const char *v = xport__env_str(id);
  char *end;
  unsigned long long n;
  if (!v)
    return def;
  errno = 0;
  n = strtoull(v, &end, 0);
  if (errno || end == v || v[0] == '-')
    goto bad;
  unsigned shift = 0;
  switch (*end) {
  case 'k': case 'K': shift = 10; end++; break;
  case 'm': case 'M': shift = 20; end++; break;
  case 'g': case 'G': shift = 30; end++; break;
  }
  /* A value that does not fit is malformed, not wrapped around. */
  if (*end || n > (unsigned long long)SIZE_MAX >> shift)
    goto bad;
  return (size_t)(n << shift);
bad:
  XPORT__WARN("%s=%s is not a size; using %zu", env_table[id].name, v, def);
  return def;
}
