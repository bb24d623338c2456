#!/bin/sh
# Runs the fuzz targets (make check-fuzz): each first replays every input
# in regress/<target>/ (every one that ever crashed it), then fuzzes for
# FUZZ_SECONDS from the seed corpus in corpus/<target>/, FUZZ_JOBS targets
# at a time. New inputs go to OUTDIR/corpus/<target>/, never into the
# tree; a crash fails its target, the input kept in OUTDIR/crash/.
# Usage: run.sh OUTDIR FUZZDIR TARGET...
set -u
out=$1 dir=$2
shift 2
secs=${FUZZ_SECONDS:-60}
jobs=${FUZZ_JOBS:-2}
mkdir -p "$out/crash" "$out/log"

one() {
  t=$1 bin=$out/fuzz_$1 log=$out/log/$1.log
  : > "$log"
  # Replayed one by one, so that each is named when it fails.
  for f in "$dir/regress/$t"/*; do
    [ -f "$f" ] || continue
    if ! "$bin" "$f" >> "$log" 2>&1; then
      echo "FAIL: fuzz $t: regression input $f crashes it again (log: $log)"
      return 1
    fi
  done
  mkdir -p "$out/corpus/$t"
  if ! "$bin" -max_total_time="$secs" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
      -artifact_prefix="$out/crash/$t-" "$out/corpus/$t" "$dir/corpus/$t" >> "$log" 2>&1; then
    echo "FAIL: fuzz $t: crashed; the input is in $out/crash/ (log: $log); once xport is"
    echo "  fixed, keep it as test/fuzz/regress/$t/<what it found>"
    grep -E '^(==[0-9]+==ERROR|SUMMARY|.*runtime error)' "$log" | head -5 | sed 's/^/  /'
    return 1
  fi
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1)
  echo "PASS: fuzz $t: $(ls "$dir/regress/$t" 2>/dev/null | wc -l) regression inputs, $runs runs in ${secs}s, $cov"
}

fail=0 n=0 pids=
for t in "$@"; do
  if [ ! -x "$out/fuzz_$t" ]; then
    echo "FAIL: fuzz $t: $out/fuzz_$t is not built (make fuzz)"; fail=1; continue
  fi
  one "$t" > "$out/log/$t.result" &
  pids="$pids $!" n=$((n + 1))
  if [ "$n" -ge "$jobs" ]; then
    for p in $pids; do wait "$p" || fail=1; done
    pids= n=0
  fi
done
for p in $pids; do wait "$p" || fail=1; done
for t in "$@"; do
  [ -f "$out/log/$t.result" ] && cat "$out/log/$t.result"
done
exit $fail
