#!/bin/bash
# examples/allreduce beside Open MPI's MPI_Allreduce (bench/allreduce_mpi.c),
# on this node, in one run: the same sizes (8 B to 16 MiB), iteration
# counts, data and verification, 4 ranks (NP=...), xport with its default
# transports (XPORT_PROVIDER unset: xshm between ranks of this node, tcp
# beside it). Prints each program's table, then one with the ratio per size.
#
#   make && top_builddir=. bash bench/allreduce.sh [--iters N]
#
# The MPI side is built here with mpicc (MPI is optional for xport, so it is
# not in Makefile.am): Debian's libopenmpi-dev / openmpi-bin.
set -u
b=${top_builddir:-.}
src=$(cd "$(dirname "$0")/.." && pwd)
np=${NP:-4}
tmp=$(mktemp -d /tmp/xport-allreduce-bench.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
TMPDIR=$tmp; export TMPDIR # Open MPI's session directories
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
unset XPORT_PROVIDER XPORT_SHM

for tool in mpicc mpirun; do
  command -v $tool >/dev/null || { echo "allreduce.sh: no $tool (Debian: libopenmpi-dev openmpi-bin)"; exit 77; }
done
[ -x "$b/examples/allreduce" ] || { echo "allreduce.sh: build first (make): no $b/examples/allreduce"; exit 1; }
mpicc -O2 -o "$tmp/allreduce_mpi" "$src/bench/allreduce_mpi.c" || exit 1

echo "== xport: mpirun -np $np examples/allreduce $*"
timeout 600 mpirun -np "$np" "$b/examples/allreduce" "$@" >"$tmp/xport.out" 2>&1
rx=$?
cat "$tmp/xport.out"
echo "== Open MPI: mpirun -np $np allreduce_mpi $*"
timeout 600 mpirun -np "$np" "$tmp/allreduce_mpi" "$@" >"$tmp/mpi.out" 2>&1
rm=$?
cat "$tmp/mpi.out"
[ $rx = 0 ] && [ $rm = 0 ] || { echo "allreduce.sh: a run failed (xport rc $rx, MPI rc $rm)"; exit 1; }

echo "== side by side ($np ranks on $(hostname), $(nproc) cores; time: average per call)"
awk 'FNR == 1 { file++ }
     $1 !~ /^[0-9]+$/ || NF < 7 { next }
     file == 1 { algo[$1] = $3; xt[$1] = $5; xb[$1] = $7; order[++k] = $1 }
     file == 2 { mt[$1] = $4; mb[$1] = $6 }
     END {
       printf "#%11s %5s %12s %12s %10s %12s %12s\n", "size(B)", "algo", "xport(us)", "MPI(us)",
              "xport/MPI", "xport busbw", "MPI busbw"
       for (i = 1; i <= k; i++) { s = order[i]
         printf "%12s %5s %12.2f %12.2f %10.2f %12.3f %12.3f\n", s, algo[s], xt[s], mt[s],
                xt[s] / mt[s], xb[s], mb[s] }
     }' "$tmp/xport.out" "$tmp/mpi.out"
