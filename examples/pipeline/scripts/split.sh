#!/bin/sh
# Split readings.csv into one CSV per station, up to the report date, and list
# the stations as a JSON array in out/stations.json.
set -eu
date=$(cat report_date.txt)
mkdir -p out/stations
awk -F, -v d="$date" 'NR > 1 && $2 <= d { print > ("out/stations/" $1 ".csv") }' readings.csv
ls out/stations | sed 's/\.csv$//' | awk 'BEGIN { printf "[" } { printf "%s\"%s\"", (NR > 1 ? "," : ""), $0 } END { print "]" }' > out/stations.json
echo "split $(wc -l < readings.csv) lines into $(ls out/stations | wc -l) stations up to $date"
