#!/bin/bash
# The application examples (hello, kvstore, wal), small, on every provider
# setting present, and their failure cases:
#
#   top_builddir=. bash test/examples.sh
#
# Settings: shm, xshm, tcp and tcp;ofi_rxm alone (XPORT_SHM=off for the two
# fabrics: without it a peer at 127.0.0.1 is reached over xshm beside them,
# and the fabric would carry nothing), the default (nothing set: tcp
# with xshm beside it), and verbs, whose examples listen on
# XPORT_TEST_HOST (an address of an RDMA NIC: make check-verbs runs this
# in the Soft-RoCE guest). A setting whose provider does not open here is
# skipped, with the reason.
#
# Failure cases, on each setting: wal with a follower SIGKILLed mid-stream
# must still pass; under fault injection (XPORT_FAULT, xport(7): a
# connection dropped as if its peer died, a registration refused) every
# example must fail cleanly: a non-zero exit, not the timeout's, a line
# naming the error, and no process or temporary file left behind.
#
# Exit: 1 on any failure, 77 when everything was skipped, else 0.
set -u

top_builddir=${top_builddir:-.}
ex=$top_builddir/examples
info=$top_builddir/tools/xport_info
npass=0 nfail=0 nskip=0
work=$(mktemp -d "${TMPDIR:-/tmp}/xport-examples.XXXXXX") || exit 1
tag="xport-examples-$$-$RANDOM"

# Every process a run started carries the tag in its environment, so that
# one left behind is found (and killed) whoever its parent was.
leftovers() {
  local e pids=
  for e in /proc/[0-9]*/environ; do
    if grep -qzx "XPORT_EXAMPLES_TAG=$tag" "$e" 2>/dev/null; then
      e=${e#/proc/}
      pids="$pids ${e%/environ}"
    fi
  done
  echo $pids
}

# The shm files (endpoints, listeners) that this run's processes left
# where they failed on purpose without closing (the fault cases over shm):
# made after the run began, and their lock free, which is how xport tells
# a file whose owner is gone (providers/shm.c, shm_sweep). Nobody else's
# are touched.
touch "$work/.began"
# Only files two seconds old or more: an owner takes its lock at once,
# and a suite running beside this one (make -j2 check) may be making
# one this instant.
shm_leftovers() {
  local l f now young=0
  now=$(date +%s)
  for l in /dev/shm/xport-*.lock; do
    f=${l%.lock}
    [ -e "$f" ] && [ "$f" -nt "$work/.began" ] || continue
    if [ $((now - $(stat -c %Y "$f"))) -lt 2 ]; then
      young=1
      continue
    fi
    flock -n -E 75 "$l" rm -f "$f" "$l" 2>/dev/null
  done
  return $young
}

cleanup() {
  local p
  for p in $(leftovers); do kill -KILL "$p" 2>/dev/null; done
  shm_leftovers || { sleep 2; shm_leftovers; }
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

pass() { echo "PASS: $*"; npass=$((npass + 1)); }
fail() { echo "FAIL: $*"; nfail=$((nfail + 1)); }
skip() { echo "SKIP: $*"; nskip=$((nskip + 1)); }

# The environment of a setting, as arguments to env.
setting_env() {
  case $1 in
    shm) echo "XPORT_PROVIDER=shm" ;;
    xshm) echo "XPORT_PROVIDER=xshm" ;;
    tcp) echo "XPORT_PROVIDER=tcp XPORT_SHM=off" ;;
    'tcp;ofi_rxm') echo "XPORT_PROVIDER=tcp;ofi_rxm XPORT_SHM=off" ;;
    verbs) echo "XPORT_PROVIDER=verbs XPORT_SHM=off" ;;
    default) echo "" ;;
  esac
}

# Why a setting cannot run here, or nothing.
setting_absent() {
  local prov=$1
  [ "$prov" = default ] && prov=
  if [ -n "$prov" ]; then
    "$info" -p "$prov" --json >/dev/null 2>&1 || echo "provider $prov does not open here (tools/xport_info -p '$prov')"
  else
    "$info" --json >/dev/null 2>&1 || echo "no provider opens here (tools/xport_info)"
  fi
}

# run SETTING FAULT PROGRAM ARGS...: runs one example in a temporary
# directory of its own; leaves its status in $rc, its output in $work/out.
run() {
  local setting=$1 fault=$2
  shift 2
  local -a vars
  IFS=' ' read -r -a vars <<<"$(setting_env "$setting")"
  rm -rf "$work/tmp" && mkdir "$work/tmp"
  env -u XPORT_PROVIDER -u XPORT_SHM -u XPORT_FAULT "${vars[@]}" ${fault:+XPORT_FAULT=$fault} \
    XPORT_EXAMPLES_TAG="$tag" TMPDIR="$work/tmp" timeout 120 "$@" >"$work/out" 2>&1
  rc=$?
}

# What a run left behind: processes (killed) and files; empty when clean.
residue() {
  local p left=$(leftovers) files
  for p in $left; do kill -KILL "$p" 2>/dev/null; done
  files=$(ls -A "$work/tmp" 2>/dev/null)
  [ -n "$left" ] && echo -n "processes left behind:$left; "
  [ -n "$files" ] && echo -n "files left behind: $files"
}

show() { sed 's/^/    | /' "$work/out" | grep -v 'warn: tcp;ofi_rxm' | tail -n 15; }

# check_ok SETTING NAME PROGRAM ARGS...: must exit 0 and end with "NAME: ok".
check_ok() {
  local setting=$1 name=$2 what="$2${4:+ ${*:4}} on $1"
  shift 2
  run "$setting" "" "$@"
  local last=$(grep -v 'warn: tcp;ofi_rxm' "$work/out" | tail -n 1) res=$(residue)
  if [ $rc -eq 0 ] && [ "${last#"$name: ok"}" != "$last" ] && [ -z "$res" ]; then
    pass "$what: ${last#"$name: "}"
  else
    fail "$what: exit $rc${res:+, $res}"
    show
  fi
}

# check_fails SETTING FAULT NAME PROGRAM ARGS...: must fail cleanly.
check_fails() {
  local setting=$1 fault=$2 name=$3 what="$3${5:+ ${*:5}} under XPORT_FAULT=$2 on $1"
  shift 3
  run "$setting" "$fault" "$@"
  local res=$(residue) why
  if [ $rc -eq 0 ]; then
    why="it exited 0"
  elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    why="it hung (killed by timeout)"
  elif ! grep -q "^$name: .*: " "$work/out"; then
    why="no line names the error"
  elif [ -n "$res" ]; then
    why=$res
  fi
  if [ -z "${why:-}" ]; then
    pass "$what: failed cleanly (exit $rc: $(grep -m1 "^$name: .*: " "$work/out"))"
  else
    fail "$what: $why"
    show
  fi
}

# XPORT_TEST_CONFIGS narrows the run as it does the suites' (the default
# setting is the suites' xshm+tcp).
wanted() {
  local name=$1
  [ "$name" = default ] && name=xshm+tcp
  [ -z "${XPORT_TEST_CONFIGS:-}" ] || case ",$XPORT_TEST_CONFIGS," in *",$name,"*) ;; *) return 1 ;; esac
}

for setting in shm xshm tcp 'tcp;ofi_rxm' default verbs; do
  if ! wanted "$setting"; then
    skip "examples on $setting: not in XPORT_TEST_CONFIGS"
    continue
  fi
  absent=$(setting_absent "$setting")
  if [ -n "$absent" ]; then
    for e in hello "kvstore --check" "wal --check" "wal --check --kill-follower 1" "fault cases"; do
      skip "$e on $setting: $absent"
    done
    continue
  fi
  # Where they listen: 127.0.0.1, or for verbs the NIC's address.
  at=() h=()
  if [ "$setting" = verbs ]; then
    at=("${XPORT_TEST_HOST:-127.0.0.1}")
    h=(-H "${at[0]}")
  fi
  check_ok "$setting" hello "$ex/hello" "${at[@]}"
  check_ok "$setting" kvstore "$ex/kvstore" --check "${h[@]}"
  check_ok "$setting" wal "$ex/wal" --check "${h[@]}"
  check_ok "$setting" wal "$ex/wal" --check --kill-follower 1 "${h[@]}"
  check_fails "$setting" drop_conn:1 hello "$ex/hello" "${at[@]}"
  check_fails "$setting" drop_conn:300 kvstore "$ex/kvstore" --check "${h[@]}"
  check_fails "$setting" mr_reg:1 kvstore "$ex/kvstore" --check "${h[@]}"
  check_fails "$setting" drop_conn:300 wal "$ex/wal" --check "${h[@]}"
  check_fails "$setting" mr_reg:1 wal "$ex/wal" --check "${h[@]}"
done

echo "examples: $npass passed, $nfail failed, $nskip skipped"
[ $nfail -gt 0 ] && exit 1
[ $npass -eq 0 ] && exit 77
exit 0
