#!/bin/bash
set -euo pipefail
python3 - <<'PY'
claims = {}
for line in open("/app/services.conf"):
    line = line.strip()
    if not line or line.startswith("#"):
        continue
    name, port = line.split()
    claims.setdefault(int(port), []).append(name)
with open("/app/conflicts.txt", "w") as out:
    for port in sorted(claims):
        if len(claims[port]) > 1:
            out.write(f"{port}: {', '.join(claims[port])}\n")
PY
