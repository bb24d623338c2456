#!/bin/sh
# xport_info and xport_perf on every provider configuration present:
# xport_info --json parses and names the provider asked for; xport_perf
# --loopback --check passes every test at a few sizes, and the atomic
# tests where the provider has atomics (elsewhere: skipped, once
# xport_perf is seen to refuse them with status 2).
set -u
# In a /dev/shm of its own where root can make one: an shm endpoint that
# a loopback's peer left a first message unread at is kept an hour after
# its process (xport_ctx_destroy(3)), and these runs would leave one
# behind each time; the mount goes, and they with it, when this ends.
if [ "$(id -u)" = 0 ] && [ -z "${XPORT_TOOLS_PRIVATE_SHM:-}" ] && unshare -m true 2>/dev/null; then
  XPORT_TOOLS_PRIVATE_SHM=1 exec unshare -m sh -c \
    'mount -t tmpfs -o mode=1777 none /dev/shm && exec sh "$0" "$@"' "$0" "$@"
fi
top_builddir=${top_builddir:-.}
info="$top_builddir/tools/xport_info"
perf="$top_builddir/tools/xport_perf"
PYTHON=${PYTHON:-python3}
pass=0
fail=0
skip=0
check() { # name, then the command
  name=$1
  shift
  if out=$("$@" 2>&1); then
    pass=$((pass + 1))
  else
    fail=$((fail + 1))
    echo "FAIL: $name"
    echo "$out" | tail -5
  fi
}

# xshm+PROV: xport's own shared memory beside the fabric (XPORT_SHM=auto,
# the default), shm+PROV: libfabric's (XPORT_SHM=libfabric), so that the
# loopback's connection runs over it and xport_perf says so ("transport");
# one size there, the others having run on each alone.
for cfg in tcp tcp-strict "tcp;ofi_rxm" shm xshm xshm+tcp "shm+tcp;ofi_rxm"; do
  prov=${cfg%-strict}
  prov=${prov#*shm+}
  strict=0 shm=off over=$prov beside=none sizes="1 4099 65536"
  [ "$cfg" = tcp-strict ] && strict=1
  case $cfg in
    xshm+*) shm=auto over=xshm beside=xshm sizes=4099 ;;
    shm+*) shm=libfabric over=shm beside=shm sizes=4099 ;;
  esac
  export XPORT_STRICT=$strict XPORT_LOG=none XPORT_SHM=$shm
  if ! XPORT_PROVIDER="$prov" "$info" --json > /dev/null 2>&1; then
    echo "SKIP: tools on $cfg: xport_info finds no usable $prov"
    skip=$((skip + 1))
    continue
  fi
  echo "=== tools on $cfg ==="
  check "xport_info --json on $cfg" sh -c "\"$info\" -p '$prov' --json | \"$PYTHON\" -c '
import json, sys
d = json.load(sys.stdin)
c = d[\"chosen\"]
assert c[\"provider\"] == sys.argv[1], c[\"provider\"]
for k in (\"provider\", \"fabric\", \"domain\", \"ep_type\", \"max_msg_size\", \"imm_bits\", \"rma\", \"write_imm\", \"mr_mode\", \"wait_fd\", \"progress\"):
    assert k in c, k
assert d[\"candidates\"]
for x in d[\"candidates\"]:
    assert {\"provider\", \"domain\", \"verdict\", \"reason\"} <= set(x), x
    assert x[\"verdict\"] in (\"chosen\", \"usable\", \"rejected\")
beside = [x for x in d[\"candidates\"] if x[\"verdict\"] == \"chosen\" and \"beside\" in x[\"reason\"]]
assert [x[\"provider\"] for x in beside] == ([] if sys.argv[2] == \"none\" else [sys.argv[2]]), beside
' '$prov' $beside"
  # The table shows each place once: no usable row repeats the chosen one
  # (shm: libfabric lists it twice, differing in nothing the table shows).
  check "xport_info's table on $cfg: the chosen row not repeated as usable" sh -c "
    \"$info\" -p '$prov' | awk '\$1 == \"chosen\" { c = \$2 \" \" \$3 \" \" \$4 \" \" \$5 }
      \$1 == \"usable\" && \$2 \" \" \$3 \" \" \$4 \" \" \$5 == c { print; bad = 1 } END { exit bad }'"
  for t in send_lat send_bw write_lat write_bw read_lat read_bw write_imm_lat; do
    for size in $sizes; do
      check "xport_perf $t $size on $cfg" sh -c "\"$perf\" --loopback --check -p '$prov' -t $t -s $size -n 30 --warmup 3 -w 8 --json | \"$PYTHON\" -c '
import json, sys
lines = [json.loads(l) for l in sys.stdin if l.strip()]
assert len(lines) == 1, lines
r = lines[0]
assert r[\"test\"] == sys.argv[1] and r[\"size\"] == int(sys.argv[2]) and r[\"check\"] == \"ok\", r
assert r[\"provider\"] == sys.argv[3] and r[\"transport\"] == sys.argv[4], r
keys = (\"lat_us_min\", \"lat_us_median\", \"lat_us_mean\", \"lat_us_p99\", \"lat_us_max\") if sys.argv[1].endswith(\"_lat\") else (\"bw_MBps\", \"msg_rate\")
for k in keys:
    assert r[k] > 0, (k, r)
' $t $size '$prov' '$over'"
    done
  done
  atomics=$("$info" -p "$prov" --json 2>/dev/null | "$PYTHON" -c '
import json, sys
print(json.load(sys.stdin)["chosen"].get("atomics", "none"))' 2>/dev/null)
  if [ "$atomics" = none ] || [ -z "$atomics" ]; then
    echo "SKIP: xport_perf atomic tests on $cfg: no atomics (xport_info: atomics ${atomics:-unknown})"
    skip=$((skip + 1))
    check "xport_perf refuses fadd_lat on $cfg" sh -c "
out=\$(\"$perf\" --loopback --check -p '$prov' -t fadd_lat -n 10 2>&1); rc=\$?
[ \$rc -eq 2 ] && printf '%s' \"\$out\" | grep -q 'no remote atomics' || { echo \"rc \$rc: \$out\"; exit 1; }"
  else
    for t in fadd_lat cswap_lat fadd_bw; do
      check "xport_perf $t on $cfg ($atomics)" sh -c "\"$perf\" --loopback --check -p '$prov' -t $t -n 200 --warmup 10 -w 8 --json | \"$PYTHON\" -c '
import json, sys
lines = [json.loads(l) for l in sys.stdin if l.strip()]
assert len(lines) == 1, lines
r = lines[0]
assert r[\"test\"] == sys.argv[1] and r[\"size\"] == 8 and r[\"iters\"] == 200 and r[\"check\"] == \"ok\", r
assert r[\"provider\"] == sys.argv[2] and r[\"transport\"] == sys.argv[3], r
if sys.argv[1].endswith(\"_lat\"):
    keys = (\"lat_us_min\", \"lat_us_median\", \"lat_us_mean\", \"lat_us_p99\", \"lat_us_max\")
    assert r[\"lat_round_trip\"] is True, r
else:
    keys = (\"bw_MBps\", \"msg_rate\", \"mops\")
for k in keys:
    assert r[k] > 0, (k, r)
' $t '$prov' '$over'"
    done
  fi
  check "xport_perf -a on $cfg" sh -c "\"$perf\" --loopback --check -p '$prov' -t write_bw -a -n 4 --warmup 1 -w 4 --csv | grep -c ',ok$' | grep -qx 24"
done
# The candidate table a reader sees: no two rows alike (libfabric's
# look-alike entries are one row with a count), every entry under -v and
# in --json. The demo's first screen: the choice and why, then the result.
if XPORT_LOG=none "$info" --json > /dev/null 2>&1; then
  check "xport_info rows are told apart" sh -c "
rows() { sed -n '/^candidates/,/^\$/p' | grep '^  [a-z]'; }
t=\$(XPORT_LOG=none \"$info\" | rows) && v=\$(XPORT_LOG=none \"$info\" -v | rows) || exit 1
d=\$(printf '%s\\n' \"\$t\" | sort | uniq -d); [ -z \"\$d\" ] || { echo \"alike: \$d\"; exit 1; }
j=\$(XPORT_LOG=none \"$info\" --json | \"$PYTHON\" -c 'import json,sys; print(len(json.load(sys.stdin)[\"candidates\"]))')
[ \"\$(printf '%s\\n' \"\$v\" | wc -l)\" -eq \"\$j\" ] || { echo \"-v: not the \$j of --json\"; exit 1; }"
fi
demo="$top_builddir/examples/demo"
if XPORT_PROVIDER=shm XPORT_LOG=none "$info" --json > /dev/null 2>&1; then
  check "demo's first screen" sh -c "
out=\$(XPORT_PROVIDER=shm XPORT_LOG=warn \"$demo\" 2>&1) || { echo \"\$out\"; exit 1; }
printf '%s\\n' \"\$out\" | grep -q '^probe: chose shm (domain shm): first requested' &&
printf '%s\\n' \"\$out\" | grep -q 'xport_info' &&
printf '%s\\n' \"\$out\" | grep -q '^client: 8 messages .* every byte verified' &&
printf '%s\\n' \"\$out\" | grep -q '^demo: 8 round trips over shm, all bytes verified' &&
[ \"\$(printf '%s\\n' \"\$out\" | wc -l)\" -le 6 ] || { echo \"\$out\"; exit 1; }"
fi
echo "tools: $pass passed, $fail failed, $skip skipped"
[ "$fail" -eq 0 ] || exit 1
[ "$pass" -gt 0 ] || exit 77
exit 0
