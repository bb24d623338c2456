#!/usr/bin/env bash
# Runs xport_perf and fi_pingpong alternately on the same provider and
# sizes, and prints xport's cost relative to raw libfabric:
#   latency ratio   = xport mean one-way latency / fi_pingpong usec/xfer
#   bandwidth ratio = xport MB/s / fi_pingpong MB/sec (ping-pong bandwidth)
# fi_pingpong's usec/xfer is elapsed / iterations / 2, the same one-way
# mean xport_perf reports. Below the provider's inject size fi_pingpong
# uses fi_inject, which produces no send completion; xport always reports
# one, so small-message ratios include that difference.
#
# usage: bench/compare.sh [ROUNDS]   (from the build directory or with
#        XPORT_PERF=path/to/xport_perf)
set -u
rounds=${1:-3}
perf=${XPORT_PERF:-$(dirname "$0")/../tools/xport_perf}
[ -x "$perf" ] || perf=./tools/xport_perf
command -v fi_pingpong >/dev/null || { echo "compare: fi_pingpong not found (libfabric-bin)"; exit 2; }
[ -x "$perf" ] || { echo "compare: xport_perf not found; set XPORT_PERF"; exit 2; }

median() { sort -g | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }

iters_for() { case $1 in 64) echo 20000;; 4096) echo 10000;; *) echo 500;; esac; }

# prints "usec MBps" for one fi_pingpong run
pingpong() {
  local prov=$1 ep=$2 size=$3 iters=$4 port=$((40000 + RANDOM % 20000))
  fi_pingpong -p "$prov" -e "$ep" -B "$port" -I "$iters" -S "$size" >/dev/null 2>&1 &
  local srv=$!
  sleep 0.3
  local out
  out=$(fi_pingpong -p "$prov" -e "$ep" -P "$port" -I "$iters" -S "$size" 127.0.0.1 2>/dev/null | tail -1)
  wait "$srv" 2>/dev/null
  echo "$out" | awk '{print $7, $6}'
}

# prints "usec MBps" for one xport_perf run
xperf() {
  local prov=$1 size=$2 iters=$3 line
  line=$("$perf" --loopback -p "$prov" -t send_lat -s "$size" -n "$iters" --warmup 100 --json | tail -1)
  echo "$line" | sed -n 's/.*"lat_us_mean":\([0-9.]*\).*/\1/p' |
    awk -v s="$size" '{printf "%s %.2f\n", $1, s / $1}'
}

printf '%-6s %8s %12s %12s %9s %12s %12s %9s\n' provider size "fi usec" "xport usec" "lat x" \
  "fi MB/s" "xport MB/s" "bw x"
for prov in shm tcp; do
  ep=msg
  [ "$prov" = shm ] && ep=rdm
  for size in 64 4096 1048576; do
    iters=$(iters_for "$size")
    fl=(); fb=(); xl=(); xb=()
    # Alternate which one goes first, so that neither always runs on the
    # heels of the other.
    for ((r = 0; r < rounds; r++)); do
      if ((r % 2)); then
        read -r a b < <(xperf "$prov" "$size" "$iters")
        xl+=("$a"); xb+=("$b")
        read -r a b < <(pingpong "$prov" "$ep" "$size" "$iters")
        fl+=("$a"); fb+=("$b")
      else
        read -r a b < <(pingpong "$prov" "$ep" "$size" "$iters")
        fl+=("$a"); fb+=("$b")
        read -r a b < <(xperf "$prov" "$size" "$iters")
        xl+=("$a"); xb+=("$b")
      fi
    done
    f_l=$(printf '%s\n' "${fl[@]}" | median); f_b=$(printf '%s\n' "${fb[@]}" | median)
    x_l=$(printf '%s\n' "${xl[@]}" | median); x_b=$(printf '%s\n' "${xb[@]}" | median)
    awk -v p="$prov" -v s="$size" -v fl="$f_l" -v xl="$x_l" -v fb="$f_b" -v xb="$x_b" 'BEGIN {
      printf "%-6s %8d %12.2f %12.2f %9.3f %12.1f %12.1f %9.3f\n", p, s, fl, xl,
             (fl > 0 ? xl / fl : 0), fb, xb, (fb > 0 ? xb / fb : 0) }'
  done
done
