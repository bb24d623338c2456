#!/bin/bash
# examples/allreduce beside Open MPI's MPI_Allreduce (bench/allreduce_mpi.c)
# in one run: the same sizes (8 B to 16 MiB), iteration counts, data and
# verification, 4 ranks (NP=...), xport with its default transports
# (XPORT_PROVIDER unset: xshm between ranks of a node, tcp beside it).
# Prints each program's table, then one with the ratio per size.
#
#   make && top_builddir=. bash bench/allreduce.sh [--nodes 2] [--iters N]
#
# --nodes 2 runs both across two simulated nodes (as root: two network
# namespaces joined by a veth pair, each with a /dev/shm and a hostname of
# its own, NP/2 ranks on each; mpirun starts the far ranks by entering the
# namespace instead of by ssh). Both libraries then carry node mates over
# shared memory and the other node over TCP (Open MPI: its vader and tcp
# BTLs). The other arguments go to both programs.
#
# The MPI side is built here with mpicc (MPI is optional for xport, so it is
# not in Makefile.am): Debian's libopenmpi-dev / openmpi-bin.
set -u
b=${top_builddir:-.}
src=$(cd "$(dirname "$0")/.." && pwd)
np=${NP:-4}
nodes=1
if [ "${1:-}" = --nodes ]; then
  nodes=${2:-}; shift 2 || shift
  case $nodes in 1|2) ;; *) echo "allreduce.sh: --nodes takes 1 or 2"; exit 2 ;; esac
fi
tmp=$(mktemp -d /tmp/xport-allreduce-bench.XXXXXX)
ns_a="xbA$$"; ns_b="xbB$$"
cleanup() {
  if [ "$nodes" = 2 ]; then ip netns del "$ns_a" 2>/dev/null; ip netns del "$ns_b" 2>/dev/null; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
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

launch=(mpirun -np "$np")
where="$np ranks on $(hostname)"
if [ "$nodes" = 2 ]; then
  # Two nodes: namespaces joined by a veth pair. Every rank, and mpirun
  # itself, runs inside them; nothing connects in from this namespace.
  [ "$(id -u)" = 0 ] || { echo "allreduce.sh: --nodes 2 needs root (network namespaces)"; exit 77; }
  command -v ip >/dev/null || { echo "allreduce.sh: --nodes 2 needs ip (iproute2)"; exit 77; }
  [ $((np % 2)) = 0 ] || { echo "allreduce.sh: --nodes 2 needs an even NP"; exit 2; }
  ip netns add "$ns_a" && ip netns add "$ns_b" &&
    ip link add "v$ns_a" type veth peer name "v$ns_b" &&
    ip link set "v$ns_a" netns "$ns_a" && ip link set "v$ns_b" netns "$ns_b" &&
    ip -n "$ns_a" addr add 10.97.0.1/24 dev "v$ns_a" &&
    ip -n "$ns_b" addr add 10.97.0.2/24 dev "v$ns_b" &&
    ip -n "$ns_a" link set lo up && ip -n "$ns_a" link set "v$ns_a" up &&
    ip -n "$ns_b" link set lo up && ip -n "$ns_b" link set "v$ns_b" up ||
    { echo "allreduce.sh: cannot make two namespaces joined by a veth pair here"; exit 1; }
  # Open MPI's launch agent: enter the node's namespaces instead of ssh.
  printf '%s\n' '#!/bin/sh' 'host=$1; shift' \
    'exec ip netns exec "$host" unshare -m -u sh -c '"'"'mount -t tmpfs -o mode=1777 none /dev/shm && hostname "$0" && exec sh -c "$*"'"'"' "$host" "$*"' \
    >"$tmp/agent"
  chmod +x "$tmp/agent"
  printf '%s slots=%d\n%s slots=%d\n' "$ns_a" $((np / 2)) "$ns_b" $((np / 2)) >"$tmp/hosts"
  # mpirun in the first node, in a PID namespace of its own so that no
  # daemon or rank outlives it.
  launch=(ip netns exec "$ns_a" unshare -p -f --kill-child -m --mount-proc -u sh -c
          'mount -t tmpfs -o mode=1777 none /dev/shm && hostname "$0" && exec "$@"' "$ns_a"
          mpirun --hostfile "$tmp/hosts" -np "$np" --mca plm_rsh_agent "$tmp/agent"
          --mca oob_tcp_if_include 10.97.0.0/24 --mca btl_tcp_if_include 10.97.0.0/24)
  where="$np ranks on two simulated nodes ($((np / 2)) + $((np / 2)), veth)"
fi

echo "== xport: mpirun -np $np examples/allreduce $* ($where)"
timeout 600 "${launch[@]}" "$(cd "$b" && pwd)/examples/allreduce" "$@" >"$tmp/xport.out" 2>&1
rx=$?
cat "$tmp/xport.out"
echo "== Open MPI: mpirun -np $np allreduce_mpi $* ($where)"
timeout 600 "${launch[@]}" "$tmp/allreduce_mpi" "$@" >"$tmp/mpi.out" 2>&1
rm=$?
cat "$tmp/mpi.out"
[ $rx = 0 ] && [ $rm = 0 ] || { echo "allreduce.sh: a run failed (xport rc $rx, MPI rc $rm)"; exit 1; }

echo "== side by side ($where, $(nproc) cores; time: average per call)"
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
