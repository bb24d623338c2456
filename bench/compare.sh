#!/usr/bin/env bash
# xport side by side with raw libfabric (fi_pingpong) and UCX (ucx_perftest)
# on the same provider and sizes, in one run: several rounds, the order of
# the three turned every round so that none always runs on the heels of
# another, medians, and xport's ratios to the other two.
#
#   bench/compare.sh [-r ROUNDS] [-p "shm tcp"] [-s "8 64 ..."] [-o DIR] [-l]
#
# -l: streaming runs 40 times longer (2,000,000 messages up to 4 KiB), for
# every tool alike: on a 2-core machine a run of a few milliseconds is
# often spared the one preemption that a longer run of the same rate
# meets, so short runs favour the fastest tool by luck more than by rate.
#
# Measured per provider and size (one-way latency is half a round trip,
# as all three report it):
#   latency   xport_perf -t send_lat | fi_pingpong usec/xfer | ucx_perftest tag_lat
#             (xport's median and UCX's 50th percentile, as ucx_perftest's
#             "typical"; fi_pingpong reports only a mean: on a busy 2-core
#             machine its preempted round trips weigh on it)
#   bandwidth xport_perf -t send_bw  | fi_pingpong MB/sec    | ucx_perftest tag_bw
#             (fi_pingpong has no streaming test: its figure is ping-pong
#             bandwidth, size / one-way latency, and is drawn as such)
#   message rate, the smallest size: xport_perf send_bw | ucx_perftest tag_bw
# Below the provider's inject size fi_pingpong sends by fi_inject, which
# gives no send completion; so xport_perf runs with --unsignaled, which
# sends those without one too (xport_send_flags(3)). At 1 MiB, latency
# over fi_pingpong's is also its ping-pong bandwidth over xport's.
#
# Transports: shm = libfabric shm, UCX_TLS=posix,cma; tcp and tcp;ofi_rxm =
# libfabric tcp (rxm over it), UCX_TLS=tcp UCX_NET_DEVICES=lo (without the
# second variable UCX also opens a lane over the machine's other interface);
# shm+tcp = xport's tcp context with shm beside it (XPORT_SHM=auto), whose
# loopback connection runs over shm, against the other tools on shm;
# xshm = xport's own shared-memory transport, against the others on shm.
# A tool that is missing (ucx-utils, libfabric-bin) is left out, and said so.
#
# Writes DIR/runs.csv (every run) and DIR/medians.csv, which bench/plot.sh
# draws (DIR defaults to bench-results). Run from the build directory, or
# set XPORT_PERF=path/to/xport_perf. A benchmark: it asserts nothing.
set -u
rounds=3
provs="shm tcp"
sizes="8 64 512 4096 32768 262144 1048576"
out=bench-results
bwmul=1
while getopts "r:p:s:o:lh" o; do
  case $o in
    r) rounds=$OPTARG ;;
    p) provs=$OPTARG ;;
    s) sizes=$OPTARG ;;
    o) out=$OPTARG ;;
    l) bwmul=40 ;;
    *) sed -n '2,33p' "$0"; exit 2 ;;
  esac
done
# Each provider measured alone: with shm beside the fabric (XPORT_SHM's
# default) a loopback over "tcp" would run over shm. "shm+tcp" (-p) is
# that case on purpose: xport's tcp context, its connection over shm,
# against the raw tools on shm, which is what the connection runs on.
export XPORT_SHM=off
perf=${XPORT_PERF:-$(dirname "$0")/../tools/xport_perf}
[ -x "$perf" ] || perf=./tools/xport_perf
[ -x "$perf" ] || { echo "compare: xport_perf not found; set XPORT_PERF"; exit 2; }
have_fi=1 have_ucx=1
command -v fi_pingpong >/dev/null || { have_fi=0; echo "compare: no fi_pingpong (apt-get install libfabric-bin): left out"; }
command -v ucx_perftest >/dev/null || { have_ucx=0; echo "compare: no ucx_perftest (apt-get install ucx-utils): left out"; }
mkdir -p "$out"
runs=$out/runs.csv
echo "provider,size,tool,round,lat_us,bw_MBps,msg_rate" > "$runs"

lat_iters() { if (($1 <= 4096)); then echo 10000; elif (($1 <= 65536)); then echo 2000; else echo 300; fi; }
bw_iters() { if (($1 <= 4096)); then echo $((50000 * bwmul)); elif (($1 <= 65536)); then echo $((5000 * bwmul)); else echo $((500 * bwmul)); fi; }
port() { echo $((20000 + RANDOM % 20000)); }

# Each tool prints "lat_us bw_MBps msg_rate" (a field it cannot measure: 0).
run_xport() { # prov size
  local lat bw
  case $1 in shm+*) XPORT_SHM=auto run_xport_on "${1#shm+}" "$2"; return ;; esac
  run_xport_on "$1" "$2"
}
run_xport_on() {
  local lat bw
  lat=$("$perf" --loopback -p "$1" -t send_lat -s "$2" -n "$(lat_iters "$2")" --unsignaled --json 2>/dev/null |
        tail -1 | sed -n 's/.*"lat_us_median":\([0-9.e+-]*\).*/\1/p')
  bw=$("$perf" --loopback -p "$1" -t send_bw -s "$2" -n "$(bw_iters "$2")" --unsignaled --json 2>/dev/null |
       tail -1 | sed -n 's/.*"bw_MBps":\([0-9.e+-]*\).*"msg_rate":\([0-9.e+-]*\).*/\1 \2/p')
  echo "${lat:-0} ${bw:-0 0}"
}

run_fi() { # prov size
  local ep=msg p; p=$(port)
  case $1 in shm+* | xshm) set -- shm "$2" ;; esac
  [ "$1" = tcp ] || ep=rdm
  fi_pingpong -p "$1" -e "$ep" -B "$p" -I "$(lat_iters "$2")" -S "$2" >/dev/null 2>&1 &
  local srv=$! line
  sleep 0.3
  line=$(fi_pingpong -p "$1" -e "$ep" -P "$p" -I "$(lat_iters "$2")" -S "$2" 127.0.0.1 2>/dev/null | tail -1)
  wait "$srv" 2>/dev/null
  # bytes #sent #ack total time MB/sec usec/xfer Mxfers/sec
  echo "$line" | awk '{ if (NF >= 8) print $7, $6, $8 * 1e6; else print 0, 0, 0 }'
}

ucx_env() {
  case $1 in
    shm | shm+* | xshm) echo "UCX_TLS=posix,cma" ;;
    *) echo "UCX_TLS=tcp UCX_NET_DEVICES=lo" ;;
  esac
}

ucx_one() { # prov size test iters -> the Final line
  local p; p=$(port)
  env $(ucx_env "$1") ucx_perftest -p "$p" >/dev/null 2>&1 &
  local srv=$! line
  sleep 0.5
  line=$(env $(ucx_env "$1") ucx_perftest 127.0.0.1 -p "$p" -t "$3" -s "$2" -n "$4" 2>/dev/null |
         grep '^Final:')
  wait "$srv" 2>/dev/null
  echo "$line"
}

run_ucx() { # prov size
  local l b
  l=$(ucx_one "$1" "$2" tag_lat "$(lat_iters "$2")" | awk '{print $4}')
  b=$(ucx_one "$1" "$2" tag_bw "$(bw_iters "$2")" | awk '{print $6, $8}')
  echo "${l:-0} ${b:-0 0}"
}

tools=(xport)
((have_fi)) && tools+=(fi)
((have_ucx)) && tools+=(ucx)
for prov in $provs; do
  for size in $sizes; do
    for ((r = 0; r < rounds; r++)); do
      for ((k = 0; k < ${#tools[@]}; k++)); do
        t=${tools[$(((k + r) % ${#tools[@]}))]}
        read -r l b m < <("run_$t" "$prov" "$size")
        echo "$prov,$size,$t,$r,$l,$b,$m" >> "$runs"
      done
    done
  done
done

# Medians per provider, size and tool; then xport's ratios.
med=$out/medians.csv
awk -F, 'NR > 1 { k = $1 "," $2 "," $3; n[k]++; L[k, n[k]] = $5; B[k, n[k]] = $6; M[k, n[k]] = $7 }
  function median(A, k, c,   i, j, t, v) {
    for (i = 1; i <= c; i++) v[i] = A[k, i] + 0
    for (i = 2; i <= c; i++) for (j = i; j > 1 && v[j-1] > v[j]; j--) { t = v[j]; v[j] = v[j-1]; v[j-1] = t }
    return c % 2 ? v[(c + 1) / 2] : (v[c / 2] + v[c / 2 + 1]) / 2
  }
  END { print "provider,size,tool,lat_us,bw_MBps,msg_rate"
        for (k in n) printf "%s,%g,%g,%g\n", k, median(L, k, n[k]), median(B, k, n[k]), median(M, k, n[k]) }' \
  "$runs" | { read -r h; echo "$h"; sort -t, -k1,1 -k2,2n -k3,3; } > "$med"

awk -F, 'NR > 1 { k = $1 "," $2; L[k, $3] = $4; B[k, $3] = $5; M[k, $3] = $6; if (!(k in seen)) { seen[k] = 1; o[++n] = k } }
  function r(a, b) { return (a > 0 && b > 0) ? sprintf("%.3f", a / b) : "-" }
  END {
    printf "%-12s %8s %9s %9s %9s %8s %8s %10s %10s %10s %8s %8s\n", "provider", "size", "xport us",
           "fi us", "ucx us", "lat/fi", "lat/ucx", "xport MB/s", "fi MB/s", "ucx MB/s", "bw/ucx",
           "ppbw/fi"
    for (i = 1; i <= n; i++) { k = o[i]; split(k, f, ",")
      printf "%-12s %8d %9.2f %9.2f %9.2f %8s %8s %10.1f %10.1f %10.1f %8s %8s\n", f[1], f[2],
             L[k, "xport"], L[k, "fi"], L[k, "ucx"], r(L[k, "xport"], L[k, "fi"]),
             r(L[k, "xport"], L[k, "ucx"]), B[k, "xport"], B[k, "fi"], B[k, "ucx"],
             r(B[k, "xport"], B[k, "ucx"]), r(L[k, "fi"], L[k, "xport"])
      if (!(f[1] in rate)) { rate[f[1]] = 1
        printf "%-12s %8d message rate: xport %.0f/s, ucx %.0f/s (ratio %s)\n", f[1], f[2],
               M[k, "xport"], M[k, "ucx"], r(M[k, "xport"], M[k, "ucx"]) }
    }
    printf "lat/fi, lat/ucx: xport latency over theirs (below 1: xport faster); bw/ucx: xport streaming bandwidth over UCX'"'"'s; ppbw/fi: xport ping-pong bandwidth (size over one-way latency) over fi_pingpong'"'"'s, the figure fi_pingpong reports (above 1: xport faster)\n"
  }' "$med"
echo "compare: every run in $runs, medians in $med; draw them with: bench/plot.sh $out"
