#!/usr/bin/env bash
# Draws what bench/compare.sh measured: per provider one PNG with latency
# and bandwidth against message size, xport, fi_pingpong and ucx_perftest
# side by side (fi_pingpong's bandwidth is ping-pong bandwidth).
#
#   bench/plot.sh [DIR]     reads DIR/medians.csv (default bench-results),
#                           writes DIR/PROVIDER.png
#
# Needs gnuplot (apt-get install gnuplot-nox).
set -u
dir=${1:-bench-results}
med=$dir/medians.csv
[ -f "$med" ] || { echo "plot: no $med: run bench/compare.sh first"; exit 2; }
command -v gnuplot >/dev/null || { echo "plot: gnuplot not found (apt-get install gnuplot-nox)"; exit 2; }
for prov in $(awk -F, 'NR > 1 {print $1}' "$med" | sort -u); do
  safe=$(echo "$prov" | tr ';' '_')
  for tool in xport fi ucx; do
    awk -F, -v p="$prov" -v t="$tool" 'NR > 1 && $1 == p && $3 == t {print $2, $4, $5}' "$med" \
      > "$dir/.$safe.$tool.dat"
  done
  gnuplot <<EOF
set terminal pngcairo size 1200,500 font ",10" noenhanced
set output "$dir/$safe.png"
set multiplot layout 1,2 title "$prov: xport, libfabric (fi_pingpong) and UCX (ucx_perftest)"
set logscale xy
set format x "%.0s%cB"
set xlabel "message size"
set grid
set key top left
set ylabel "one-way latency (us)"
plot "$dir/.$safe.xport.dat" using 1:2 with linespoints title "xport send_lat", \
     "$dir/.$safe.fi.dat" using 1:2 with linespoints title "fi_pingpong", \
     "$dir/.$safe.ucx.dat" using 1:2 with linespoints title "ucx tag_lat"
set ylabel "bandwidth (MB/s)"
plot "$dir/.$safe.xport.dat" using 1:3 with linespoints title "xport send_bw", \
     "$dir/.$safe.fi.dat" using 1:3 with linespoints title "fi_pingpong (ping-pong)", \
     "$dir/.$safe.ucx.dat" using 1:3 with linespoints title "ucx tag_bw"
unset multiplot
EOF
  rm -f "$dir/.$safe".*.dat
  echo "plot: $dir/$safe.png"
done
