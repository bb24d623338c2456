#!/bin/sh
# The job layer under real launchers: test/job_ranks as 4 ranks under
# mpirun on one node (shm, tcp, tcp;ofi_rxm), across two simulated nodes
# (network and mount namespaces joined by a veth pair: tcp, tcp;ofi_rxm),
# under srun --mpi=pmix with Slurm started here, with a rank killed
# mid-job, and without any launcher. Every address is one this script
# assigns inside namespaces it made, and every client and server runs
# inside them: nothing connects from the machine's own namespace to them.
# Each case prints PASS/FAIL/SKIP with why; the last line counts them.
# Nothing outlives it: every launcher, and Slurm with its munged, runs in
# a PID namespace of its own, whose processes the kernel kills when it
# ends; their files are in $tmp, removed at exit.
set -u
b=${top_builddir:-.}
ranks="$b/test/job_ranks"
pass=0; fail=0; skip=0
tmp=$(mktemp -d /tmp/xport-jobs.XXXXXX)
ns_a="xjA$$"; ns_b="xjB$$"
slurm_ns=""
# The fabric named carries every pair, unless a case says otherwise:
# cases with xshm beside it (XPORT_SHM=auto, the default) check who went
# over which.
XPORT_SHM=off; export XPORT_SHM

cleanup() {
  # unshare ignores TERM while its child runs; killed, it takes its
  # namespace's first process (--kill-child), and with it every process of
  # the namespace (slurmstepd, the ranks), along.
  if [ -n "$slurm_ns" ]; then kill -KILL "$slurm_ns" 2>/dev/null; wait "$slurm_ns" 2>/dev/null; fi
  ip netns del "$ns_a" 2>/dev/null
  ip netns del "$ns_b" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
# Open MPI's session directories (a launcher killed by timeout leaves them).
TMPDIR=$tmp; export TMPDIR

ok()   { pass=$((pass + 1)); echo "PASS: jobs: $*"; }
bad()  { fail=$((fail + 1)); echo "FAIL: jobs: $*"; }
skip() { skip=$((skip + 1)); echo "SKIP: jobs $1: $2"; }

# Open MPI as root needs both variables; 4 ranks on 2 cores oversubscribe.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_btl=self,vader,tcp
# Under AddressSanitizer (make check-sanitizers): libpmix keeps a few bytes
# of its own to the end (pmix_rte_init); the leaks that count are xport's.
printf 'leak:libpmix.so\n' >"$tmp/lsan.supp"
export LSAN_OPTIONS="suppressions=$tmp/lsan.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}"

# count_ok LOG N: N ranks said ok, and none failed
count_ok() {
  n=$(grep -c '^job_ranks: rank .*: ok' "$1")
  [ "$n" = "$2" ] && ! grep -q 'FAIL' "$1"
}

# Runs "$@" in a mount namespace with a /dev/shm of its own: libfabric's
# shm files of killed ranks go with it, and two "nodes" never share one;
# and in a PID namespace of its own, so that no launcher's daemon or rank
# outlives the launcher, however it ends.
in_ns="unshare -p -f --kill-child -m --mount-proc"
private_shm() {
  $in_ns sh -c 'mount -t tmpfs -o mode=1777 none /dev/shm && exec "$@"' sh "$@"
}

# job_case WHAT CMD...: CMD (a launcher running job_ranks, in a /dev/shm of
# its own) must exit 0 with all 4 ranks ok.
job_case() {
  what=$1; shift
  log="$tmp/case.log"
  private_shm timeout 120 "$@" >"$log" 2>&1
  rc=$?
  if [ $rc = 0 ] && count_ok "$log" 4; then
    ok "$what"
  else
    # The ranks' own words first: sanitizer reports can fill the tail, and
    # xport's warnings, each said by every rank, the head.
    bad "$what (rc $rc):"
    { grep -E '^job_ranks' "$log"; grep -E 'xport' "$log" | sort | uniq -c; } | sed 's/^/  /' | head -20
    sed 's/^/  /' "$log" | tail -20
    # mpirun exits 128 + N when a rank died of signal N, and says so
    # ("exited on signal N"); without that line it died itself: Open MPI
    # 4.1.4's has (SIGSEGV in PMIx_server_finalize) while it ended a job
    # whose rank had failed, its own crash after the failure shown above.
    if [ $rc -gt 128 ] && [ $rc -lt 160 ] && ! grep -q 'exited on signal' "$log"; then
      echo "  (the launcher itself died of signal $((rc - 128)), after what the ranks say above)"
    fi
  fi
}

# ---- without a launcher -----------------------------------------------------
if ! grep -q '^#define XPORT_HAVE_PMIX 1' "$b/config.h" 2>/dev/null; then
  skip "(all)" "libxport was built without PMIx (install libpmix-dev and reconfigure)"
  echo "jobs: $pass passed, $fail failed, $skip skipped"
  exit 77
fi
out=$(env -u PMIX_NAMESPACE -u PMIX_RANK XPORT_JOB=auto XPORT_PROVIDER=tcp timeout 60 "$ranks" 2>&1)
case "$out" in
*"rank 0 of 1 on"*ok*) ok "no launcher: a job of size 1" ;;
*) bad "no launcher: expected a job of size 1, got: $out" ;;
esac
out=$(XPORT_JOB=pmix XPORT_PROVIDER=tcp timeout 60 "$ranks" 2>&1); rc=$?
case "$rc:$out" in
124:*) bad "XPORT_JOB=pmix without a launcher hung" ;;
0:*) bad "XPORT_JOB=pmix without a launcher succeeded" ;;
*PMIX_NAMESPACE*mpirun*) ok "XPORT_JOB=pmix without a launcher fails, naming the launcher's variables" ;;
*) bad "XPORT_JOB=pmix without a launcher: unclear failure: $out" ;;
esac

# ---- mpirun on one node -------------------------------------------------------
if ! command -v mpirun >/dev/null 2>&1; then
  skip "mpirun" "no mpirun (Debian: openmpi-bin)"
else
  for prov in shm xshm tcp "tcp;ofi_rxm"; do
    job_case "mpirun -np 4, one node, $prov: every pair connected; messages, writes, reads verified" \
      mpirun -np 4 -x LSAN_OPTIONS -x XPORT_SHM -x XPORT_PROVIDER="$prov" "$ranks"
  done
  # Every rank holding one key file of the user's (not the job's key): the
  # job layer's crossing connects under a key. A listener's refusal was
  # taken for a reset there (3 of 5 runs over tcp failed).
  head -c 32 /dev/urandom >"$tmp/job.key" && chmod 600 "$tmp/job.key"
  for prov in tcp "tcp;ofi_rxm"; do
    job_case "mpirun -np 4, one node, $prov, every rank with XPORT_AUTH_KEY_FILE: every pair verified" \
      mpirun -np 4 -x LSAN_OPTIONS -x XPORT_SHM -x XPORT_PROVIDER="$prov" \
      -x XPORT_AUTH_KEY_FILE="$tmp/job.key" "$ranks"
  done
  # xport's own shared memory beside tcp (the default): every peer is on
  # this node, so every pair goes over xshm.
  log="$tmp/mixed1.log"
  (XPORT_SHM=auto; export XPORT_SHM
   private_shm timeout 120 mpirun -np 4 -x LSAN_OPTIONS -x XPORT_SHM -x XPORT_PROVIDER=tcp \
     "$ranks" >"$log" 2>&1)
  rc=$?
  if [ $rc = 0 ] && count_ok "$log" 4 && [ "$(grep -c 'over: .*=xshm' "$log")" = 4 ] &&
     ! grep 'over:' "$log" | grep -q '=tcp'; then
    ok "mpirun -np 4, one node, tcp with xshm beside (XPORT_SHM=auto): every pair over xshm"
  else
    bad "mpirun -np 4, one node, XPORT_SHM=auto (rc $rc):"; sed 's/^/  /' "$log" | tail -20
  fi

  # A rank busy outside xport for longer than XPORT_JOB_TIMEOUT: its
  # peers' xport_job_conn time out, and asking again then succeeds.
  for prov in tcp "tcp;ofi_rxm"; do
    job_case "a rank busy past XPORT_JOB_TIMEOUT, $prov: asking again connects" \
      mpirun -np 4 -x JOB_BUSY_RANK=1 -x XPORT_JOB_TIMEOUT=1000 -x LSAN_OPTIONS -x XPORT_SHM \
      -x XPORT_PROVIDER="$prov" "$ranks"
  done

  # ... and with its progress thread on, it accepts while it is busy: it
  # stays outside xport until each peer's first xport_job_conn to it has
  # connected (they leave marks in JOB_MARKS), which only the thread can
  # make happen before the peers' 30 s run out.
  for prov in shm tcp "tcp;ofi_rxm"; do
    rm -rf "$tmp/marks"; mkdir "$tmp/marks"
    job_case "a rank busy outside xport with its progress thread on, $prov: connected at once" \
      mpirun -np 4 -x JOB_BUSY_RANK=1 -x JOB_MARKS="$tmp/marks" -x XPORT_JOB_TIMEOUT=30000 \
      -x XPORT_PROGRESS_THREAD=1 -x LSAN_OPTIONS -x XPORT_SHM -x XPORT_PROVIDER="$prov" "$ranks"
  done

  log="$tmp/ring.log"
  private_shm timeout 120 mpirun -np 4 -x LSAN_OPTIONS -x XPORT_SHM -x XPORT_PROVIDER=tcp "$b/examples/ring" >"$log" 2>&1
  if [ $? = 0 ] && grep -q 'ring: 4 ranks over tcp, 3 laps' "$log"; then
    ok "mpirun -np 4 ./examples/ring, as the README shows"
  else
    bad "mpirun -np 4 ./examples/ring:"; sed 's/^/  /' "$log" | tail -20
  fi

  for prov in shm tcp; do
    log="$tmp/perf.log"
    private_shm timeout 120 mpirun -np 2 -x LSAN_OPTIONS -x XPORT_SHM "$b/tools/xport_perf" -p "$prov" \
      -t send_lat --check -n 200 --json >"$log" 2>&1
    if [ $? = 0 ] && grep -q "\"provider\":\"$prov\".*\"check\":\"ok\"" "$log"; then
      ok "mpirun -np 2 xport_perf -p $prov -t send_lat --check: rank 0 served, rank 1 measured"
    else
      bad "mpirun -np 2 xport_perf -p $prov:"; sed 's/^/  /' "$log" | tail -20
    fi
  done

  # A rank killed mid-job: the survivors' operations to it fail (recovery
  # on, so the launcher lets them finish and say so), and under the
  # launcher's default it ends the job with its own report, not a hang.
  for prov in shm xshm tcp "tcp;ofi_rxm"; do
    log="$tmp/kill.log"
    private_shm timeout 120 mpirun --enable-recovery -np 4 -x JOB_DIE_RANK=3 \
      -x JOB_SURVIVORS_EXIT=1 -x LSAN_OPTIONS -x XPORT_SHM -x XPORT_PROVIDER="$prov" "$ranks" >"$log" 2>&1
    rc=$?
    n=$(grep -c 'rank 3 died' "$log")
    if [ $rc != 124 ] && [ "$n" = 3 ] && ! grep -q FAIL "$log"; then
      ok "a rank killed mid-job, $prov: its 3 peers' operations to it failed"
    else
      bad "a rank killed mid-job, $prov (rc $rc, $n of 3 saw it):"; sed 's/^/  /' "$log" | tail -20
    fi
    private_shm timeout 120 mpirun -np 4 -x JOB_DIE_RANK=3 -x LSAN_OPTIONS -x XPORT_SHM -x XPORT_PROVIDER="$prov" \
      "$ranks" >"$log" 2>&1
    rc=$?
    if [ $rc != 0 ] && [ $rc != 124 ] && grep -q 'signal 9' "$log"; then
      ok "a rank killed mid-job, $prov: mpirun ends the job and reports it (rc $rc)"
    else
      bad "a rank killed mid-job, $prov: mpirun rc $rc, no report:"; sed 's/^/  /' "$log" | tail -20
    fi
  done

  # ---- two nodes: namespaces joined by a veth pair --------------------------
  if [ "$(id -u)" != 0 ] || ! ip netns add "$ns_a" 2>/dev/null; then
    skip "two nodes" "network namespaces need root and ip netns (iproute2)"
  elif ! ip netns add "$ns_b" ||
       ! ip link add "v$ns_a" type veth peer name "v$ns_b" ||
       ! ip link set "v$ns_a" netns "$ns_a" || ! ip link set "v$ns_b" netns "$ns_b"; then
    skip "two nodes" "cannot make a veth pair between namespaces here"
  else
    ip -n "$ns_a" addr add 10.98.0.1/24 dev "v$ns_a"
    ip -n "$ns_b" addr add 10.98.0.2/24 dev "v$ns_b"
    for n in "$ns_a" "$ns_b"; do
      ip -n "$n" link set lo up; ip -n "$n" link set "v$n" up
    done
    # Open MPI's launch agent: enter the node's namespaces instead of ssh.
    cat >"$tmp/agent" <<EOF
#!/bin/sh
host=\$1; shift
exec ip netns exec "\$host" unshare -m -u sh -c 'mount -t tmpfs -o mode=1777 none /dev/shm && hostname "\$0" && exec sh -c "\$*"' "\$host" "\$*"
EOF
    chmod +x "$tmp/agent"
    printf '%s slots=2\n%s slots=2\n' "$ns_a" "$ns_b" >"$tmp/hosts"
    for mode in off auto; do
    for prov in tcp "tcp;ofi_rxm"; do
      log="$tmp/two.log"
      XPORT_SHM=$mode ip netns exec "$ns_a" $in_ns -u sh -c \
        'mount -t tmpfs -o mode=1777 none /dev/shm && hostname "$0" && exec "$@"' "$ns_a" \
        timeout 180 mpirun --hostfile "$tmp/hosts" -np 4 --mca plm_rsh_agent "$tmp/agent" \
        --mca oob_tcp_if_include 10.98.0.0/24 --mca btl_tcp_if_include 10.98.0.0/24 \
        -x LSAN_OPTIONS -x XPORT_SHM -x XPORT_PROVIDER="$prov" "$(cd "$b" && pwd)/test/job_ranks" >"$log" 2>&1
      rc=$?
      na=$(grep -c "($ns_a): ok" "$log"); nb=$(grep -c "($ns_b): ok" "$log")
      # Ranks 0, 1 run on the first node, 2, 3 on the second (slots=2):
      # with shm beside the fabric a rank's node mate (rank ^ 1) comes
      # over shm and the other node's ranks over the fabric; without it,
      # every peer over the fabric.
      want_ok=1
      for r in 0 1 2 3; do
        line=$(grep "^job_ranks: rank $r of 4 .*: ok" "$log")
        for p in 0 1 2 3; do
          [ $p = $r ] && continue
          if [ $mode = auto ] && [ $((p / 2)) = $((r / 2)) ]; then w=xshm; else w=$prov; fi
          case "$line" in *" $p=$w"|*" $p=$w "*) ;; *) want_ok=0 ;; esac
        done
      done
      if [ $rc = 0 ] && count_ok "$log" 4 && [ "$na" = 2 ] && [ "$nb" = 2 ] && [ $want_ok = 1 ]; then
        if [ $mode = auto ]; then
          ok "mpirun -np 4 over two nodes (2 + 2), $prov with xshm beside: node mates over xshm, the other node over $prov, every pair verified"
        else
          ok "mpirun -np 4 over two nodes (2 + 2), $prov: every pair verified"
        fi
      else
        bad "mpirun -np 4 over two nodes, $prov, XPORT_SHM=$mode (rc $rc, $na + $nb ranks ok, transports as expected: $want_ok):"
        sed 's/^/  /' "$log" | tail -20
      fi
    done
    done
    # The allreduce example across the two nodes, as a user runs it: the
    # default (node mates over xshm, the other node over tcp).
    log="$tmp/two-allreduce.log"
    XPORT_SHM=auto ip netns exec "$ns_a" $in_ns -u sh -c \
      'mount -t tmpfs -o mode=1777 none /dev/shm && hostname "$0" && exec "$@"' "$ns_a" \
      timeout 180 mpirun --hostfile "$tmp/hosts" -np 4 --mca plm_rsh_agent "$tmp/agent" \
      --mca oob_tcp_if_include 10.98.0.0/24 --mca btl_tcp_if_include 10.98.0.0/24 \
      -x LSAN_OPTIONS -x XPORT_SHM -x XPORT_PROVIDER=tcp "$(cd "$b" && pwd)/examples/allreduce" --check >"$log" 2>&1
    rc=$?
    if [ $rc = 0 ] && grep -q '^allreduce: ok: 4 ranks' "$log"; then
      ok "mpirun -np 4 ./examples/allreduce --check over two nodes (2 + 2), tcp with xshm beside: every sum verified"
    else
      bad "mpirun -np 4 ./examples/allreduce --check over two nodes (rc $rc):"; sed 's/^/  /' "$log" | tail -20
    fi
  fi
fi

# ---- srun --mpi=pmix, with Slurm started here ---------------------------------
srun_case() {
  if ! command -v srun >/dev/null || ! command -v slurmctld >/dev/null ||
     ! command -v slurmd >/dev/null || ! command -v munged >/dev/null; then
    skip "srun" "no Slurm (Debian: slurmctld slurmd slurm-client munge)"; return
  fi
  if [ "$(id -u)" != 0 ]; then skip "srun" "starting slurmd needs root"; return; fi
  # Its state, spool and TmpFS here, fresh each run: srun's PMIx plugin
  # makes TmpFS/spmix_appdir_UID_JOB.STEP, which a step of an earlier run
  # left in /tmp (job numbers restart at 1), and the step of that number
  # then failed to launch ("task 0 launch failed: Unspecified error").
  s="$tmp/slurm"; mkdir -p "$s/spool" "$s/state" "$s/tmp" && chmod 711 "$tmp" "$s"
  # A munged of its own, with a key of its own: none of the machine's is
  # needed or touched.
  dd if=/dev/urandom of="$s/munge.key" bs=1024 count=1 2>/dev/null && chmod 400 "$s/munge.key"
  host=$(hostname -s)
  port=$((20000 + $$ % 20000))
  cat >"$s/slurm.conf" <<EOF
ClusterName=xport
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$port
SlurmdPort=$((port + 1))
AuthType=auth/munge
AuthInfo=socket=$s/munge.sock
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$s/state
TmpFS=$s/tmp
SlurmdSpoolDir=$s/spool
SlurmctldPidFile=$s/ctld.pid
SlurmdPidFile=$s/d.pid
SlurmctldLogFile=$s/ctld.log
SlurmdLogFile=$s/d.log
ReturnToService=2
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
NodeName=$host NodeAddr=127.0.0.1 CPUs=$(nproc) State=UNKNOWN
PartitionName=xport Nodes=$host Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
EOF
  export SLURM_CONF="$s/slurm.conf"
  # The daemons, the steps they start and the ranks all in one PID and
  # mount namespace (a /dev/shm of its own): a slurmstepd [2.0] once
  # outlived every run, for good.
  cat >"$s/daemons" <<EOF
mount -t tmpfs -o mode=1777 none /dev/shm || exit 1
munged --socket=$s/munge.sock --key-file=$s/munge.key --log-file=$s/munge.log \\
  --pid-file=$s/munged.pid --seed-file=$s/munge.seed 2>"$s/munge.err" || exit 1
slurmctld -D >/dev/null 2>&1 &
slurmd -D >/dev/null 2>&1 &
wait
EOF
  $in_ns sh "$s/daemons" &
  slurm_ns=$!
  i=0
  until sinfo -h -o %T 2>/dev/null | grep -q idle; do
    i=$((i + 1))
    if ! kill -0 "$slurm_ns" 2>/dev/null; then
      skip "srun" "munged or Slurm did not start: $(cat "$s/munge.err" 2>/dev/null)"
      return
    fi
    if [ $i -gt 60 ]; then
      skip "srun" "Slurm did not come up in 30 s: $(tail -3 "$s/ctld.log" "$s/d.log" 2>/dev/null | tr '\n' ' ')"
      return
    fi
    sleep 0.5
  done
  for prov in tcp shm; do
    log="$tmp/srun.log"
    XPORT_PROVIDER="$prov" timeout 180 srun --mpi=pmix -n 4 --overcommit "$(cd "$b" && pwd)/test/job_ranks" >"$log" 2>&1
    rc=$?
    if [ $rc = 0 ] && count_ok "$log" 4; then
      ok "srun --mpi=pmix -n 4, $prov: every pair verified"
    else
      bad "srun --mpi=pmix -n 4, $prov (rc $rc):"; sed 's/^/  /' "$log" | tail -20
    fi
  done
}
srun_case

echo "jobs: $pass passed, $fail failed, $skip skipped"
[ $fail = 0 ]
