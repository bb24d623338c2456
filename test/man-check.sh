#!/bin/sh
# Every exported function has a man page; every page lints clean; every
# EXAMPLE in section 3 and 7 compiles against the built library.
set -u
top_srcdir=${top_srcdir:-.}
top_builddir=${top_builddir:-.}
CC=${CC:-cc}
fail=0
pass=0
hdr="$top_srcdir/include/xport.h"

for fn in $(sed -n 's/^XPORT_API [^(]*[ *]\(xport_[a-z0-9_]*\)(.*/\1/p' "$hdr"); do
  page="$top_srcdir/man/man3/$fn.3"
  if [ ! -f "$page" ]; then
    echo "FAIL: $fn has no man page"; fail=$((fail + 1)); continue
  fi
  # A .so page must point at a page that names the function.
  target=$(sed -n 's/^\.so man3\/\(.*\)$/\1/p' "$page")
  [ -n "$target" ] && page="$top_srcdir/man/man3/$target"
  if ! sed -n '/^\.SH NAME/,/^\.SH/p' "$page" | grep -q "$fn"; then
    echo "FAIL: $fn is not in the NAME of $page"; fail=$((fail + 1)); continue
  fi
  pass=$((pass + 1))
done

if [ -n "${MANDOC:-}" ] && [ -x "$MANDOC" ]; then
  for page in "$top_srcdir"/man/man*/*.[137]; do
    grep -q '^\.so ' "$page" && continue
    out=$("$MANDOC" -T lint -W warning "$page" 2>&1)
    if [ -n "$out" ]; then echo "FAIL: lint $page"; echo "$out"; fail=$((fail + 1))
    else pass=$((pass + 1)); fi
  done
else
  for page in "$top_srcdir"/man/man*/*.[137]; do
    grep -q '^\.so ' "$page" && continue
    out=$(groff -ww -z -man "$page" 2>&1)
    if [ -n "$out" ]; then echo "FAIL: groff $page"; echo "$out"; fail=$((fail + 1))
    else pass=$((pass + 1)); fi
  done
fi

# The pages' sections, in the required order.
for page in "$top_srcdir"/man/man3/*.3; do
  grep -q '^\.so ' "$page" && continue
  got=$(sed -n 's/^\.SH \(.*\)$/\1/p' "$page" | tr '\n' '|')
  want='NAME|SYNOPSIS|DESCRIPTION|RETURN VALUE|ERRORS|ENVIRONMENT|EXAMPLE|SEE ALSO|'
  if [ "$got" != "$want" ]; then echo "FAIL: sections of $page: $got"; fail=$((fail + 1))
  else pass=$((pass + 1)); fi
done

dir="$top_builddir/test/man-examples"
mkdir -p "$dir"
lib="$top_builddir/.libs/libxport.so"
[ -f "$lib" ] || lib="$top_builddir/.libs/libxport.a"
for page in "$top_srcdir"/man/man3/*.3 "$top_srcdir"/man/man7/xport.7; do
  grep -q '^\.so ' "$page" && continue
  name=$(basename "$page")
  sed -n '/^\.EX$/,/^\.EE$/p' "$page" | sed '1d;$d' | sed 's/\\e/\\/g; s/\\-/-/g' > "$dir/$name.c"
  if $CC -std=gnu11 -Wall -Wextra -Werror -I"$top_srcdir/include" "$dir/$name.c" "$lib" \
       $(pkg-config --libs libfabric) -pthread -o "$dir/$name.out" 2> "$dir/$name.err"; then
    pass=$((pass + 1))
  else
    echo "FAIL: EXAMPLE of $name does not compile"; cat "$dir/$name.err"; fail=$((fail + 1))
  fi
done

echo "man: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
