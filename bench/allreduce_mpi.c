/*
 * The measurement of examples/allreduce.c with Open MPI's MPI_Allreduce,
 * for bench/allreduce.sh to set side by side: the same sizes, iteration
 * counts, data and verification, out of place, float sum.
 *
 *   mpicc -O2 -o allreduce_mpi bench/allreduce_mpi.c
 *   mpirun -np 4 ./allreduce_mpi [--iters N]
 */
#include <mpi.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define AM_MAX_BYTES (16u << 20)

/* As examples/allreduce.c: a small integer per (rank, element, call). */
static float am_value(int r, size_t i, unsigned seq)
{
  return (float)((int)(((unsigned)r * 7u + (unsigned)i * 13u + seq * 5u) % 19u) - 9);
}

static int am_iters_for(size_t bytes, int fixed)
{
  if (fixed > 0)
    return fixed;
  size_t k = (64u << 20) / bytes;
  return k < 5 ? 5 : k > 200 ? 200 : (int)k;
}

static long am_verify(const float *res, size_t count, int n, unsigned seq)
{
  long bad = 0;
  for (size_t i = 0; i < count; i++) {
    float want = 0.0f;
    for (int r = 0; r < n; r++)
      want += am_value(r, i, seq);
    if (memcmp(&want, &res[i], sizeof want) && bad++ == 0)
      fprintf(stderr, "allreduce_mpi: mismatch at %zu of %zu: %g, want %g\n", i, count,
              (double)res[i], (double)want);
  }
  return bad;
}

int main(int argc, char **argv)
{
  int me, n, fixed = 0;
  MPI_Init(&argc, &argv);
  MPI_Comm_rank(MPI_COMM_WORLD, &me);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  for (int i = 1; i < argc; i++)
    if (!strcmp(argv[i], "--iters") && i + 1 < argc)
      fixed = atoi(argv[++i]);
  float *src = malloc(AM_MAX_BYTES), *res = malloc(AM_MAX_BYTES);
  if (!src || !res)
    MPI_Abort(MPI_COMM_WORLD, 1);
  memset(res, 0, AM_MAX_BYTES);
  if (me == 0)
    printf("#%11s %10s %6s %11s %11s %11s  %s\n", "size(B)", "count", "iters", "time(us)",
           "algbw(GB/s)", "busbw(GB/s)", "check");
  long bad_all = 0;
  unsigned seq = 0;
  for (size_t bytes = 8; bytes <= AM_MAX_BYTES; bytes = bytes < 16 ? 16 : bytes * 4) {
    size_t count = bytes / sizeof(float);
    int iters = am_iters_for(bytes, fixed);
    for (size_t i = 0; i < count; i++)
      src[i] = am_value(me, i, seq);
    for (int w = 0; w < 2; w++)
      MPI_Allreduce(src, res, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    for (int it = 0; it < iters; it++)
      MPI_Allreduce(src, res, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    double us = (MPI_Wtime() - t0) * 1e6 / iters;
    memset(res, 0xff, bytes);
    MPI_Allreduce(src, res, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    long bad = am_verify(res, count, n, seq), bad_sum = 0;
    double us_sum = 0;
    MPI_Reduce(&us, &us_sum, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
    MPI_Allreduce(&bad, &bad_sum, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
    bad_all += bad_sum;
    if (me == 0) {
      double avg = us_sum / n, algbw = bytes / avg / 1e3;
      printf("%12zu %10zu %6d %11.2f %11.3f %11.3f  %s\n", bytes, count, iters, avg, algbw,
             algbw * 2.0 * (n - 1) / n, bad_sum ? "WRONG" : "ok");
    }
  }
  free(src);
  free(res);
  MPI_Finalize();
  return bad_all ? 1 : 0;
}
