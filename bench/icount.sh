#!/usr/bin/env bash
# Instructions per round trip, xport over raw libfabric, counted with
# callgrind rather than timed, so that a noisy machine cannot move them:
#
#   bench/icount.sh [-r ROUNDS] [-s SIZE] [-p PROVIDER] [-n REPS]
#
# bench/icount runs a ping-pong between two processes (xport's public
# API, or raw libfabric opened as fi_pingpong opens it: fi_tinject below
# the inject size, no send completion) and switches callgrind's
# collection on only inside the library calls of the initiating side.
# Polls that find nothing are waiting, not work: each run counts them,
# a second run measures what one empty poll costs, and that is taken
# out. Printed: instructions per round trip for each, and the ratio.
# The raw side always opens FI_EP_RDM: compare like with like on shm and
# tcp;ofi_rxm (over plain tcp xport runs FI_EP_MSG).
# Needs valgrind (Debian's valgrind package); a benchmark: it asserts
# nothing. Run from the build directory.
set -u
rounds=2000
size=64
prov=shm
reps=3
while getopts "r:s:p:n:h" o; do
  case $o in
    r) rounds=$OPTARG ;;
    n) reps=$OPTARG ;;
    s) size=$OPTARG ;;
    p) prov=$OPTARG ;;
    *) sed -n '2,16p' "$0"; exit 2 ;;
  esac
done
bin=${ICOUNT:-./bench/icount}
command -v valgrind >/dev/null || { echo "icount: valgrind is not installed (apt-get install valgrind)"; exit 1; }
[ -x "$bin" ] || { echo "icount: $bin not built (make)"; exit 1; }
run=
[ -x ./libtool ] && run="./libtool --mode=execute"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Collected instructions of the counted process (the other collects none),
# and the empty polls it reports.
count() {
  rm -f "$tmp"/cg.*
  local out
  # libtool's wrapper script runs the program: valgrind must see the
  # program itself.
  out=$(XPORT_SHM=off XPORT_PROVIDER=$prov $run valgrind --tool=callgrind --collect-atstart=no \
        --callgrind-out-file="$tmp/cg.%p" "$bin" "$@" 2>/dev/null) || return 1
  local ir
  ir=$(cat "$tmp"/cg.* | awk '/^(summary|totals):/ { if ($2 > m) m = $2 } END { print m + 0 }')
  echo "$ir $(echo "$out" | awk '/^rounds/ { print $4 }')"
}

# What the provider does per round trip can vary with how the two
# processes interleave (shm on a loaded machine: raw libfabric's count
# rose by a quarter in some runs, xport's did not): each kind runs REPS
# times and the least count stands, the work a round trip cannot do
# without.
for kind in xport xport-unsignaled raw; do
  read -r eir _ < <(count "$kind" "$rounds" "$size" empty) || { echo "icount: $kind empty run failed"; exit 1; }
  per=
  for ((k = 0; k < reps; k++)); do
    read -r ir empty < <(count "$kind" "$rounds" "$size") || { echo "icount: $kind run failed"; exit 1; }
    p=$(awk -v t="$ir" -v e="$empty" -v ec="$eir" -v r="$rounds" \
          'BEGIN { printf "%.0f", (t - e * ec / r) / r }')
    [ -z "$per" ] || [ "$p" -lt "$per" ] && per=$p
  done
  eper=$(awk -v ec="$eir" -v r="$rounds" 'BEGIN { printf "%.0f", ec / r }')
  printf '%-16s %s B over %s: %s instructions per round trip (one empty poll: %s)\n' \
    "$kind" "$size" "$prov" "$per" "$eper"
  eval "per_${kind//-/_}=$per"
done
awk -v x="$per_xport" -v u="$per_xport_unsignaled" -v r="$per_raw" 'BEGIN {
  printf "ratio xport/raw: %.2f (signaled sends), %.2f (unsignaled, as fi_pingpong: no send completion)\n", x / r, u / r }'
