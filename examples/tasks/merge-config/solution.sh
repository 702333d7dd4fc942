#!/bin/bash
# Reference solution for merge-config.
set -euo pipefail
cd /app
python3 - <<'PY'
import configparser
import os

merged = configparser.ConfigParser()
merged.read(["defaults.ini", "overrides.ini"])  # later files override earlier ones
merged["server"]["port"] = os.environ["APP_PORT"]
with open("merged.ini", "w") as f:
    merged.write(f)
PY
