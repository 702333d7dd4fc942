#!/bin/bash
# Reference solution for word-count.
set -euo pipefail
cd /app
python3 - <<'PY'
import json
import re
from collections import Counter

counts = Counter(re.findall(r"[a-z]+", open("input.txt").read().lower()))
with open("counts.json", "w") as f:
    json.dump(dict(sorted(counts.items())), f, indent=2)
best = min(counts, key=lambda w: (-counts[w], w))
with open("top.txt", "w") as f:
    f.write(best + "\n")
PY
