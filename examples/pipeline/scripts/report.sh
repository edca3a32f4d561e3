#!/bin/sh
# Turn the kept station summaries (one JSON object per line) into a report.
set -eu
{
  echo "# Hot stations, week ending $(cat report_date.txt)"
  echo
  echo "| station | days | mean °C | max °C |"
  echo "| --- | --- | --- | --- |"
  sed -n 's/.*"station": "\([^"]*\)", "days": \([0-9]*\), "mean": \([0-9.-]*\), "max": \([0-9.-]*\).*/| \1 | \2 | \3 | \4 |/p' hot.jsonl
} > out/report.md
cat out/report.md
