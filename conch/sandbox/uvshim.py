"""The `uv`/`uvx` shim installed in the base root: offline interpreter requests that never fail silently.

Why: a sandbox has no network, so uv cannot download an interpreter. A verifier asking for a Python version the
root has (`uvx -p 3.13`, the Terminal-Bench 2.x line) runs unchanged. One asking for a version the root lacks
(`-p 3.11`, `--python=3.12`, `UV_PYTHON=3.10`) would die with "no interpreter found" and read as a 0; instead
the shim hands uv the closest installed version (ties: the newer) and writes one line saying so to stderr and
to the warnings file, which `conch.verify` turns into a result warning. Anything that is not a plain version
request (a path, a range such as `>=3.10`, an implementation name) is passed through untouched.

Only the options of uv itself are read: for `uvx` / `uv run` / `uv tool run` the scan stops at the command to
run, so `uvx pytest -p no:cacheprovider` keeps pytest's own `-p`. Options that take a value are listed so their
values are not mistaken for that command.
"""

from __future__ import annotations

# Written to /usr/local/bin/uv and /usr/local/bin/uvx; @REAL@ and @WARN@ are filled in by `render`.
_TEMPLATE = r"""#!/bin/bash
# conch offline interpreter shim for uv (see conch/sandbox/uvshim.py in the conch sources).
real="@REAL@/$(basename "$0")"
[ -x "$real" ] || real="@REAL@/uv"
warnfile="@WARN@"

installed() {  # installed minor versions of python3, one per line
  local f
  for f in /usr/local/bin/python3.* /usr/bin/python3.*; do
    f=${f##*/python3.}
    case $f in ''|*[!0-9]*) ;; *) echo "$f" ;; esac
  done | sort -un
}

# echo the request to give uv: the same, or the closest installed version (and a warning)
resolve() {
  local req=$1 v minor patch have best="" bestd=999 d
  v=${req#cpython}; v=${v#-}; v=${v#python}
  if [[ ! $v =~ ^3\.([0-9]+)(\.([0-9]+))?$ ]]; then echo "$req"; return; fi
  minor=${BASH_REMATCH[1]}; patch=${BASH_REMATCH[3]}
  have=$(installed)
  [ -n "$have" ] || { echo "$req"; return; }
  if grep -qx "$minor" <<<"$have"; then
    if [ -z "$patch" ]; then echo "$req"; return; fi
    local got
    got=$("python3.$minor" -c 'import sys; print(sys.version_info[2])' 2>/dev/null)
    if [ "$got" = "$patch" ]; then echo "$req"; return; fi
    best=$minor
  else
    for h in $have; do
      d=$(( h > minor ? h - minor : minor - h ))
      if [ "$d" -le "$bestd" ]; then bestd=$d; best=$h; fi
    done
  fi
  local msg="conch: $(basename "$0"): Python $v was requested but is not installed in this sandbox (no network to download it); using Python 3.$best instead"
  echo "$msg" >&2
  { mkdir -p "${warnfile%/*}" && echo "$msg" >>"$warnfile"; } 2>/dev/null
  echo "3.$best"
}

# options of uv/uvx that take a value (their value is not the command to run)
takes_value() {
  case $1 in
    -p|--python|-w|--with|--with-editable|--with-requirements|--from|--index|--index-url|-i|\
    --extra-index-url|--default-index|-f|--find-links|-c|--constraint|--constraints|--override|--overrides|\
    --cache-dir|--directory|--project|--config-file|--env-file|--python-platform|--python-version|--color|\
    --resolution|--prerelease|--exclude-newer|--index-strategy|--keyring-provider|--link-mode|\
    --refresh-package|--reinstall-package|-P|--upgrade-package|--no-binary-package|--no-build-package|\
    --config-setting|-C|--extra|--group|--only-group|--no-group|--package|--target|--prefix|-r|--requirements|\
    -e|--editable|-o|--output-file|--build-constraint|-b|--build-constraints|--allow-insecure-host|\
    --cache|--executable|--script|--no-emit-package|--install-dir|--bin) return 0 ;;
  esac
  return 1
}

args=("$@")
out=()
stop_at_command=0
[ "$(basename "$0")" = uvx ] && stop_at_command=1
i=0; n=${#args[@]}; sub=""
while [ $i -lt $n ]; do
  a=${args[$i]}
  if [ "$a" = "--" ]; then out+=("${args[@]:$i}"); i=$n; break; fi
  case $a in
    -p|--python)
      out+=("$a"); i=$((i+1))
      [ $i -lt $n ] && out+=("$(resolve "${args[$i]}")")
      i=$((i+1)); continue ;;
    --python=*) out+=("--python=$(resolve "${a#--python=}")"); i=$((i+1)); continue ;;
    -p?*) out+=("-p" "$(resolve "${a#-p}")"); i=$((i+1)); continue ;;
    -*)
      out+=("$a"); i=$((i+1))
      if [[ $a != *=* ]] && takes_value "$a" && [ $i -lt $n ]; then out+=("${args[$i]}"); i=$((i+1)); fi
      continue ;;
  esac
  # a positional word
  if [ $stop_at_command = 1 ]; then out+=("${args[@]:$i}"); i=$n; break; fi
  out+=("$a"); i=$((i+1))
  if [ -z "$sub" ]; then
    sub=$a
    [ "$sub" = run ] && stop_at_command=1
  elif [ "$sub" = tool ] && [ "$a" = run ]; then
    stop_at_command=1
  fi
done

if [ -n "${UV_PYTHON:-}" ]; then UV_PYTHON=$(resolve "$UV_PYTHON"); export UV_PYTHON; fi

# `uv python install [3.x ...]`: offline, the versions this root has count as installed
if [ "${out[0]:-}" = python ] && [ "${out[1]:-}" = install ]; then
  for v in "${out[@]:2}"; do
    case $v in -*) continue ;; esac
    r=$(resolve "$v" 2>/dev/null)
    if [ "$r" != "$v" ] && [ "$r" != "${v#cpython-}" ]; then exec "$real" "$@"; fi
  done
  echo "conch: uv python install: using the system Python (offline); nothing to download" >&2
  exit 0
fi
exec "$real" "${out[@]}"
"""


def render(real_dir: str, warnings_file: str) -> str:
    """The shim script for a root whose real uv binaries are in `real_dir`."""
    return _TEMPLATE.replace("@REAL@", real_dir).replace("@WARN@", warnings_file)
