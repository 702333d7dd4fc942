#!/bin/bash
# Reference solution for log-levels: match the level field, not the message text.
set -euo pipefail
cd /app
{
  echo "level,count"
  for level in ERROR WARNING INFO DEBUG; do
    echo "$level,$(awk -v l="$level" '$2 == l' logs/app.log | wc -l)"
  done
} > out/summary.csv
