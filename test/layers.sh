#!/bin/sh
# The layering of libxport, checked on the objects the build made: every
# call by name goes to a file of a lower layer (README, "Layout"), or to
# one of its own layer without a circle; the two transports never name
# each other. Calls through an ops table or a request's handler are not
# names and are not seen here: that is how a lower layer reaches a higher.
#
# Layers, top first, one folder each (a file in none fails the check, so
# that a new file is placed on purpose):
#   5 jobs         src/jobs/
#   4 API          src/api/ (the public calls, and the emulated write-with-immediate)
#   3 transports   src/transport/ (one transport per name: rdm.c and rdm_*.c are
#                  rdm, one module in several files; and the registry that lists them)
#   2 core         src/core/
#   1 profiles     providers/
#   0 utilities    src/util/
set -u
top=${top_builddir:-.}
srcdir=${top_srcdir:-$top}
layer() {
  case $1 in
  src/jobs/*.c) echo 5 ;;
  src/api/*.c) echo 4 ;;
  src/transport/*.c) echo 3 ;;
  src/core/*.c) echo 2 ;;
  providers/*.c) echo 1 ;;
  src/util/*.c) echo 0 ;;
  *) echo x ;;
  esac
}
tmp=$(mktemp -d) || exit 1
trap '[ -n "${LAYERS_KEEP:-}" ] && cp "$tmp/calls" "$LAYERS_KEEP"; rm -rf "$tmp"' EXIT
n=0
# The library's sources as Makefile.am lists them (objects of files
# since removed may linger in a build tree).
srcs=$(awk '/^libxport_la_SOURCES *=/ { on = 1; next } on { for (i = 1; i <= NF; i++) if ($i ~ /\.c$/) print $i; if ($NF != "\\") exit }' "$srcdir/Makefile.am")
for src in $srcs; do
  o="$top/$(dirname "$src")/libxport_la-$(basename "$src" .c).o"
  if [ ! -f "$o" ]; then
    echo "FAIL: layers: no object $o for $src: build first"; exit 1
  fi
  nm -P "$o" | awk -v f="$src" '$2 ~ /^[TDBR]$/ { print "def", $1, f } $2 == "U" { print "use", $1, f }' >> "$tmp/syms"
  n=$((n + 1))
done
if [ "$n" -eq 0 ]; then
  echo "FAIL: layers: no sources found in $srcdir/Makefile.am"; exit 1
fi
# One line per file-to-file edge: "from to".
awk '$1 == "def" { at[$2] = $3 } $1 == "use" { u[NR] = $3 " " $2 }
     END { for (i in u) { split(u[i], p, " "); if (p[2] in at && at[p[2]] != p[1]) print p[1], at[p[2]], p[2] } }' \
  "$tmp/syms" | sort -u > "$tmp/calls"
# A transport's files are one module (rdm.c, rdm_ctl.c, ... are rdm): their
# calls among themselves are its own business.
module() {
  case $1 in
  src/transport/*) b=${1##*/}; b=${b%%.*}; echo "src/transport/${b%%_*}.c" ;;
  *) echo "$1" ;;
  esac
}
fail=0
while read -r from to sym; do
  from=$(module "$from"); to=$(module "$to")
  [ "$from" = "$to" ] && continue
  lf=$(layer "$from"); lt=$(layer "$to")
  if [ "$lf" = x ] || [ "$lt" = x ]; then
    echo "FAIL: layers: $from or $to is in no layer (test/layers.sh)"; fail=1; continue
  fi
  if [ "$lt" -gt "$lf" ]; then
    echo "FAIL: layers: $from calls $sym in $to, a higher layer"; fail=1
  elif [ "$lt" -eq "$lf" ] && [ "$lf" -eq 3 ] && [ "$from" != src/transport/registry.c ]; then
    echo "FAIL: layers: transport $from names $sym of transport $to"; fail=1
  fi
  [ "$lt" -eq "$lf" ] && echo "$from $to" >> "$tmp/same"
done < "$tmp/calls"
# Calls within a layer: no circle (tsort says so on stderr).
if [ -s "$tmp/same" ]; then
  sort -u "$tmp/same" | tsort > /dev/null 2> "$tmp/cycle"
  if [ -s "$tmp/cycle" ]; then
    echo "FAIL: layers: files of one layer call one another in a circle:"; sed 's/^/  /' "$tmp/cycle"; fail=1
  fi
fi
edges=$(wc -l < "$tmp/calls")
if [ $fail -eq 0 ]; then
  echo "PASS: layers: $n objects, $edges calls by name between files, all downward"
fi
exit $fail
