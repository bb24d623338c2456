/*
 * A token around a ring of ranks, wired up by the launcher:
 *
 *   mpirun -np 4 ./examples/ring          (Open MPI; as root add
 *                                          --allow-run-as-root --oversubscribe)
 *   srun --mpi=pmix -n 4 ./examples/ring  (Slurm)
 *
 * Each rank connects to its two neighbours through the job layer
 * (xport_job_conn: made on first use, one per pair), then rank 0 sends a
 * counter that every rank increments and passes on, for a few laps. Run
 * without a launcher it is a ring of one.
 */
#include <xport.h>

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define LAPS 3

static void die(const char *what, int rc)
{
  fprintf(stderr, "ring: %s: %s\n", what, xport_strerror(rc));
  exit(1);
}

/* Waits for one completion of the receive or send posted with flag. */
static void wait_for(xport_ctx_t *ctx, int *flag)
{
  while (!*flag) {
    xport_completion_t c;
    int n = xport_poll(ctx, &c, 1);
    if (n < 0)
      die("poll", n);
    if (n == 0) {
      xport_wait(ctx, 100);
      continue;
    }
    if (c.op == XPORT_OP_DISCONNECT)
      die("a neighbour went away", c.status ? c.status : -XPORT_ECONNRESET);
    if (c.status)
      die(c.op == XPORT_OP_RECV ? "receive" : "send", c.status);
    *(int *)c.user_ctx = 1;
  }
}

int main(void)
{
  xport_ctx_t *ctx;
  xport_job_t *job;
  xport_caps_t caps;
  int rc;

  if ((rc = xport_ctx_create(NULL, &ctx)))
    die("ctx_create", rc);
  if ((rc = xport_job_init(ctx, &job)))
    die("job_init", rc);
  xport_ctx_query(ctx, &caps);
  int me = xport_job_rank(job), n = xport_job_size(job);
  if (n == 1) {
    printf("ring: a ring of one (no launcher started this process); try mpirun -np 4\n");
    xport_job_fini(job);
    xport_ctx_destroy(ctx);
    return 0;
  }
  xport_conn_t *next, *prev;
  if ((rc = xport_job_conn(job, (me + 1) % n, &next)))
    die("connect to the next rank", rc);
  if ((rc = xport_job_conn(job, (me + n - 1) % n, &prev)))
    die("connect to the previous rank", rc);

  /* A receive is posted before the message it is for can arrive: the
   * first before a barrier, each next one before this rank sends on. */
  uint64_t token = 0, in[2] = {0, 0};
  int got[2] = {0, 0}, sent = 0;
  if ((rc = xport_recv(prev, &in[0], sizeof in[0], NULL, &got[0])))
    die("recv", rc);
  if ((rc = xport_job_barrier(job)))
    die("barrier", rc);
  for (int lap = 0; lap < LAPS; lap++) {
    int cur = lap % 2, nxt = !cur;
    if (me == 0) {
      sent = 0;
      if ((rc = xport_send(next, &token, sizeof token, NULL, &sent)))
        die("send", rc);
      wait_for(ctx, &sent);
    }
    wait_for(ctx, &got[cur]);
    got[nxt] = 0;
    if (lap + 1 < LAPS && (rc = xport_recv(prev, &in[nxt], sizeof in[nxt], NULL, &got[nxt])))
      die("recv", rc);
    if (me == 0) {
      if (in[cur] != token + (uint64_t)n - 1) {
        fprintf(stderr, "ring: lap %d: the token came back as %llu, not %llu\n", lap,
                (unsigned long long)in[cur], (unsigned long long)(token + (uint64_t)n - 1));
        return 1;
      }
      token = in[cur] + 1;
    } else {
      token = in[cur] + 1;
      sent = 0;
      if ((rc = xport_send(next, &token, sizeof token, NULL, &sent)))
        die("send", rc);
      wait_for(ctx, &sent);
    }
  }
  if (me == 0)
    printf("ring: %d ranks over %s, %d laps: the token came back as %llu each time it should\n",
           n, caps.provider, LAPS, (unsigned long long)token);
  if ((rc = xport_job_fini(job)))
    die("job_fini", rc);
  xport_ctx_destroy(ctx);
  return 0;
}
