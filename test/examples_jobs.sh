#!/bin/bash
# The job-layer examples (examples/allreduce, examples/halo) in --check
# mode: without a launcher (a job of one rank), then under mpirun -np 4 on
# every provider setting present (shm, xshm, tcp, tcp;ofi_rxm, and the
# default: tcp with xshm beside it), once with -np 3 (not a power of two),
# and their failure cases: a wrong contribution caught by the verification,
# posts pushed back (XPORT_FAULT=eagain), connections dropped
# (XPORT_FAULT=drop_conn) and a rank killed mid-run, each of which must end
# the job with the error named, never a hang or a false "ok".
#
#   top_builddir=. bash test/examples_jobs.sh
#
# Prints PASS/FAIL/SKIP per case and a summary; exits 1 on a failure, 77
# when everything was skipped. The two-simulated-nodes run is
# test/jobs.sh's (it has the namespaces and the launch agent).
set -u
b=${top_builddir:-.}
pass=0; fail=0; skip=0
tmp=$(mktemp -d /tmp/xport-examples-jobs.XXXXXX)
bg=""

# The launcher left in the background by the killed-rank case, with its
# ranks: unshare ignores TERM but its namespace dies with it on KILL;
# timeout hands TERM on to mpirun, which ends its ranks.
stop_bg() {
  [ -n "$bg" ] || return
  kill -TERM "$bg" 2>/dev/null; sleep 1; kill -KILL "$bg" 2>/dev/null
  wait "$bg" 2>/dev/null; bg=""
}
cleanup() {
  stop_bg
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
# Open MPI's session directories (a launcher killed by timeout leaves them).
TMPDIR=$tmp; export TMPDIR
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1 # 4 ranks on 2 cores
# Under AddressSanitizer (make check-sanitizers): libpmix keeps a few bytes
# of its own to the end (pmix_rte_init); the leaks that count are xport's.
# Ranks on this node inherit mpirun's environment.
printf 'leak:libpmix.so\n' >"$tmp/lsan.supp"
export LSAN_OPTIONS="suppressions=$tmp/lsan.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}"

ok()   { pass=$((pass + 1)); echo "PASS: $*"; }
bad()  { fail=$((fail + 1)); echo "FAIL: $*"; sed 's/^/  /' "$log" | grep -v 'warn: tcp;ofi_rxm' | tail -15; }
skp()  { skip=$((skip + 1)); echo "SKIP: $1: $2"; }

# As root, every launcher runs in a PID namespace of its own (no rank
# outlives it, however it ends) with a /dev/shm of its own (libfabric
# shm's files of killed ranks go with it).
ns=()
if [ "$(id -u)" = 0 ] && unshare -p -f --kill-child -m --mount-proc true 2>/dev/null; then
  ns=(unshare -p -f --kill-child -m --mount-proc
      sh -c 'mount -t tmpfs -o mode=1777 none /dev/shm && exec "$@"' sh)
fi
in_ns() { "${ns[@]}" "$@"; }

examples="allreduce halo"
log="$tmp/case.log"

# run_ok WHAT EXAMPLE CMD...: CMD must exit 0 with rank 0's "EXAMPLE: ok".
run_ok() {
  what=$1; ex=$2; shift 2
  in_ns timeout 120 "$@" >"$log" 2>&1
  rc=$?
  if [ $rc = 0 ] && grep -q "^$ex: ok" "$log"; then
    ok "$what: $(grep "^$ex: ok" "$log" | head -1 | cut -c1-160)"
  else
    bad "$what (rc $rc)"
  fi
}

# run_fails WHAT PATTERN CMD...: CMD must end (not time out), not with 0,
# and say PATTERN.
run_fails() {
  what=$1; pat=$2; shift 2
  in_ns timeout 120 "$@" >"$log" 2>&1
  rc=$?
  if [ $rc != 0 ] && [ $rc != 124 ] && grep -q "$pat" "$log"; then
    ok "$what (rc $rc): $(grep "$pat" "$log" | head -1 | cut -c1-160)"
  else
    bad "$what (rc $rc; expected a failure saying /$pat/)"
  fi
}

for ex in $examples; do
  if [ ! -x "$b/examples/$ex" ]; then
    skp "$ex" "$b/examples/$ex is not built (make)"; continue
  fi
  run_ok "$ex --check without a launcher (one rank)" "$ex" \
    env -u PMIX_NAMESPACE -u PMIX_RANK -u XPORT_PROVIDER "$b/examples/$ex" --check
done

if ! command -v mpirun >/dev/null 2>&1; then
  for ex in $examples; do skp "$ex under mpirun" "no mpirun (Debian: openmpi-bin)"; done
elif ! grep -q '^#define XPORT_HAVE_PMIX 1' "$b/config.h" 2>/dev/null; then
  for ex in $examples; do skp "$ex under mpirun" "libxport was built without PMIx (libpmix-dev)"; done
else
  # The fabric providers with XPORT_SHM=off: on one node every pair would
  # otherwise go over xshm, beside them.
  for prov in shm xshm tcp "tcp;ofi_rxm" default; do
    # XPORT_TEST_CONFIGS narrows the run as it does the suites' (the
    # default setting is the suites' xshm+tcp).
    name=$prov
    [ "$name" = default ] && name=xshm+tcp
    if [ -n "${XPORT_TEST_CONFIGS:-}" ]; then
      case ",$XPORT_TEST_CONFIGS," in
        *",$name,"*) ;;
        *) for ex in $examples; do skp "$ex on $prov" "not in XPORT_TEST_CONFIGS"; done; continue ;;
      esac
    fi
    if [ "$prov" != default ] &&
       ! XPORT_PROVIDER="$prov" "$b/tools/xport_info" -p "$prov" --json >/dev/null 2>&1; then
      for ex in $examples; do skp "$ex on $prov" "provider $prov absent (xport_info -p $prov fails)"; done
      continue
    fi
    for ex in $examples; do
      [ -x "$b/examples/$ex" ] || continue
      if [ "$prov" = default ]; then
        run_ok "mpirun -np 4 $ex --check, default (tcp with xshm beside)" "$ex" \
          env -u XPORT_PROVIDER -u XPORT_SHM mpirun -np 4 "$b/examples/$ex" --check
      else
        shm=auto; case "$prov" in tcp*) shm=off ;; esac
        run_ok "mpirun -np 4 $ex --check, $prov" "$ex" \
          mpirun -np 4 -x XPORT_PROVIDER="$prov" -x XPORT_SHM=$shm "$b/examples/$ex" --check
      fi
    done
  done

  for ex in $examples; do
    [ -x "$b/examples/$ex" ] || continue
    run_ok "mpirun -np 3 $ex --check, default (3 ranks: not a power of two)" "$ex" \
      env -u XPORT_PROVIDER -u XPORT_SHM mpirun -np 3 "$b/examples/$ex" --check

    # ---- failure cases ----
    run_fails "mpirun -np 4 $ex --check --corrupt: a wrong contribution is caught" \
      "^$ex: FAILED" mpirun -np 4 "$b/examples/$ex" --check --corrupt
    run_ok "mpirun -np 4 $ex --check, every 3rd post pushed back (XPORT_FAULT=eagain:3)" "$ex" \
      mpirun -np 4 -x XPORT_FAULT=eagain:3 "$b/examples/$ex" --check
    run_fails "mpirun -np 4 $ex --check, connections dropped (XPORT_FAULT=drop_conn:40): an error, no hang" \
      "^$ex: rank [0-9]*: .*\(reset\|not connected\|went away\)" \
      mpirun -np 4 -x XPORT_FAULT=drop_conn:40 "$b/examples/$ex" --check

    # A rank killed by SIGKILL mid-run; --enable-recovery lets the survivors
    # run on, so that it is their own error path that ends them.
    case $ex in
    allreduce) args="--iters 1000000" ;;
    halo) args="--n 32 --iters 1000000" ;;
    esac
    XPORT_PROVIDER=tcp XPORT_SHM=off "${ns[@]}" timeout 120 \
      mpirun --enable-recovery -np 4 -x XPORT_PROVIDER -x XPORT_SHM "$b/examples/$ex" $args >"$log" 2>&1 &
    bg=$!
    # Past the wire-up (rank 0's first line says so), and past the fence
    # that starts the loop: a rank killed inside a PMIx fence leaves the
    # others in it, which only their 60 s watchdog ends.
    for _ in $(seq 1 120); do
      grep -q "^# allreduce:\|^halo: .*running" "$log" && break
      sleep 0.5
    done
    sleep 2
    # The ranks are the launcher's descendants named after the example.
    victim=$(ps -eo pid=,ppid=,comm= | awk -v top="$bg" -v name="$ex" '
      { parent[$1] = $2; comm[$1] = $3 }
      END { for (p in parent) if (comm[p] == name) { q = p
              while (q in parent && q != top) q = parent[q]
              if (q == top) print p } }' | sort -n | sed -n 2p)
    if [ -z "$victim" ]; then
      stop_bg
      bad "a rank of $ex killed mid-run: no rank found to kill"
      continue
    fi
    kill -KILL "$victim"
    wait "$bg"; rc=$?; bg=""
    # mpirun --enable-recovery exits 0 when the survivors end by themselves:
    # what counts is that they ended, in time, with an error and no "ok".
    lost="^$ex: rank [0-9]*: .*\(reset\|not connected\|went away\)"
    if [ $rc != 124 ] && grep -q "$lost" "$log" && ! grep -q "^$ex: ok" "$log"; then
      ok "a rank of $ex killed mid-run (tcp; mpirun rc $rc): the survivors said so and ended: $(grep "$lost" "$log" | head -1 | cut -c1-120)"
    else
      bad "a rank of $ex killed mid-run (tcp; mpirun rc $rc): expected the survivors to fail naming the loss"
    fi
  done
fi

echo "examples_jobs: $pass passed, $fail failed, $skip skipped"
[ $fail = 0 ] || exit 1
[ $pass = 0 ] && exit 77
exit 0
