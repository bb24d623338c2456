#!/bin/sh
# Builds the fuzz targets (make fuzz): the library's sources compiled by
# FUZZ_CC with coverage for libFuzzer and the sanitizers, into one
# archive, and one program per target linked against it.
# Usage: build.sh OUTDIR 'LIBRARY SOURCES' TARGET...
# Rebuilds the archive when a source or header changed, a target when its
# file or the archive did.
set -eu
out=$1 srcs=$2
shift 2
top=${top_srcdir:-.}
jobs=${FUZZ_JOBS:-2}
mkdir -p "$out/obj"
lib=$out/libxport-fuzz.a
if [ ! -f "$lib" ] ||
  [ -n "$(find "$top/src" "$top/providers" "$top/include" -name '*.[ch]' -newer "$lib")" ]; then
  echo "  FUZZCC   libxport ($FUZZ_CC)"
  rm -f "$out"/obj/*.o "$lib"
  for s in $srcs; do
    case $s in *.c) echo "$s" ;; esac
  done | FUZZ_OUT=$out xargs -P "$jobs" -n 1 sh -c '
    o="$FUZZ_OUT/obj/$(echo "$1" | tr / _ | sed "s/\.c\$/.o/")"
    # shellcheck disable=SC2086 # the flags are lists
    $FUZZ_CC $FUZZ_CFLAGS -fsanitize=fuzzer-no-link $FUZZ_CPPFLAGS -c "$top_srcdir/$1" -o "$o"' sh
  ${AR:-ar} rcs "$lib" "$out"/obj/*.o
fi
for t in "$@"; do
  src=$top/test/fuzz/fuzz_$t.c bin=$out/fuzz_$t
  if [ ! -f "$bin" ] || [ "$lib" -nt "$bin" ] || [ "$src" -nt "$bin" ]; then
    echo "  FUZZLD   $bin"
    # shellcheck disable=SC2086
    $FUZZ_CC $FUZZ_CFLAGS -fsanitize=fuzzer $FUZZ_CPPFLAGS "$src" "$lib" $FUZZ_LIBS -o "$bin"
  fi
done
