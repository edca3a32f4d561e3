#!/bin/sh
# Summarise one station's readings: mean and max temperature, as JSON.
set -eu
station=$(cat station.txt)
awk -F, -v s="$station" '
  { n++; sum += $3; if (n == 1 || $3 > max) max = $3 }
  END { printf "{\"station\": \"%s\", \"days\": %d, \"mean\": %.2f, \"max\": %.1f}\n", s, n, sum / n, max }
' readings.csv > out/summary.json
cat out/summary.json
