"""Code-repair families: a shell script and a Python module with injected bugs.

Each program is assembled from independent sections (one output or one function each) drawn from a catalog
where every entry has a correct and a buggy form. A task injects bugs into some sections only, so the tests
(one per section) measure partial progress, and the reference fix is one `sed` per bug. The tests run the
program on hidden data, so writing the expected outputs by hand does not pass them.
"""

from __future__ import annotations

import random

from conch.tasks.synth.base import (
    TRAIN,
    TaskDraft,
    compose,
    family,
    literal,
    pick,
    say,
    sed_replace,
    words,
)

# ----------------------------------------------------------------------------------------------- shell-bugfix

# key -> (description, correct line, buggy line, expected(rows, params) -> str). {I} input var, {O} out-dir var.
_SH_SECTIONS = {
    "count": ("the number of lines of the input",
              'wc -l < "${I}" > "${O}/{f}"', 'wc -l "${I}" > "${O}/{f}"'),
    "sum": ("the sum of the second column",
            'total=0; while read -r name value; do total=$((total + value)); done < "${I}"; echo "$total" > "${O}/{f}"',
            'total=0; cat "${I}" | while read -r name value; do total=$((total + value)); done; echo "$total" > "${O}/{f}"'),
    "max": ("the largest value of the second column",
            'sort -k2,2n "${I}" | tail -n 1 | awk \'{print $2}\' > "${O}/{f}"',
            'sort -k2,2 "${I}" | tail -n 1 | awk \'{print $2}\' > "${O}/{f}"'),
    "above": ("how many lines have a second-column value greater than $LIMIT",
              'awk -v t="$LIMIT" \'$2 > t\' "${I}" | wc -l > "${O}/{f}"',
              'awk \'$2 > $LIMIT\' "${I}" | wc -l > "${O}/{f}"'),
    "names": ("the distinct names (first column), sorted, one per line",
              'cut -d\' \' -f1 "${I}" | sort -u > "${O}/{f}"',
              'cut -d\' \' -f1 "${I}" | uniq > "${O}/{f}"'),
    "top": ("the $TOP lines with the largest values, largest first",
            'sort -k2,2nr "${I}" | head -n "$TOP" > "${O}/{f}"',
            'sort -k2,2nr "${I}" | head -n "$((TOP - 1))" > "${O}/{f}"'),
    "size": ("`small` if the input has at most $MAXLINES lines, otherwise `large`",
             'if [ "$(wc -l < "${I}")" -le "$MAXLINES" ]; then echo small; else echo large; fi > "${O}/{f}"',
             'if [ "$(wc -l < "${I}")" < "$MAXLINES" ]; then echo large; else echo small; fi > "${O}/{f}"'),
}


def _sh_expect(key: str, rows: list[tuple[str, int]], limit: int, top: int, maxlines: int) -> str:
    vals = [v for _n, v in rows]
    if key == "count":
        return f"{len(rows)}\n"
    if key == "sum":
        return f"{sum(vals)}\n"
    if key == "max":
        return f"{max(vals)}\n"
    if key == "above":
        return f"{sum(1 for v in vals if v > limit)}\n"
    if key == "names":
        return "".join(n + "\n" for n in sorted({n for n, _v in rows}))
    if key == "top":
        ranked = sorted(rows, key=lambda r: -r[1])
        return "".join(f"{n} {v}\n" for n, v in ranked[:top])
    return ("small" if len(rows) <= maxlines else "large") + "\n"


def _sh_rows(rng: random.Random, names: list[str]) -> list[tuple[str, int]]:
    """Rows on which every catalog bug shows: a lone single-digit value (so a text sort picks the wrong maximum),
    one value above any LIMIT, unique values, and names that are neither sorted nor grouped."""
    vals = list(dict.fromkeys(rng.sample(range(10, 900), rng.randint(10, 28)) + [9, rng.randint(600, 899)]))
    rng.shuffle(vals)
    while True:
        rows = [(pick(rng, names), v) for v in vals]
        order = [n for n, _v in rows]
        grouped = [n for i, n in enumerate(order) if i == 0 or order[i - 1] != n]
        if grouped != sorted(set(order)):
            return rows


@family("shell-bugfix", TRAIN, "debugging", "fix injected bugs in a bash report script")
def shell_bugfix(rng: random.Random) -> TaskDraft:
    ivar, ovar = pick(rng, [("INPUT", "OUT_DIR"), ("SRC", "DEST"), ("DATA_FILE", "REPORT_DIR"), ("IN", "OUTDIR")])
    script = f"/app/{pick(rng, ['scripts', 'bin', 'tools'])}/{pick(rng, ['report', 'summarize', 'stats', 'digest'])}.sh"
    data = f"/app/data/{pick(rng, ['scores', 'readings', 'tallies', 'points'])}.txt"
    keys = rng.sample(sorted(_SH_SECTIONS), rng.randint(4, 6))
    nbugs = rng.randint(2, min(4, len(keys)))
    buggy = set(rng.sample(keys, nbugs))
    limit, top, maxlines = rng.randint(150, 500), rng.randint(2, 5), rng.randint(5, 9)
    fname = {k: f"{k}{pick(rng, ['', '_out', '-result'])}.txt" for k in keys}
    body = ["#!/bin/bash", f"# Summarize a file of '<name> <value>' lines. Usage: {script.rsplit('/', 1)[1]} [input] [out-dir]",
            f'{ivar}="${{1:-{data}}}"', f'{ovar}="${{2:-/app/out}}"',
            f"LIMIT={limit}", f"TOP={top}", f"MAXLINES={maxlines}", f'mkdir -p "${{{ovar}}}"', ""]
    fixes = []
    for k in keys:
        desc, good, bad = _SH_SECTIONS[k]
        render = lambda s: s.replace("{I}", ivar).replace("{O}", ovar).replace("{f}", fname[k])  # noqa: E731
        body.append(f"# {fname[k]}: {desc}")
        body.append(render(bad if k in buggy else good))
        if k in buggy:
            fixes.append(sed_replace(script, render(bad), render(good)))
    text = "\n".join(body) + "\n"
    names = words(rng, "name", rng.randint(4, 7))
    shown = _sh_rows(rng, names)
    hidden = _sh_rows(rng, words(rng, "animal", rng.randint(4, 7)))
    want = {fname[k]: _sh_expect(k, hidden, limit, top, maxlines) for k in keys}
    prelude = (f"SCRIPT = {script!r}\nHIDDEN = {''.join(f'{n} {v}' + chr(10) for n, v in hidden)!r}\n"
               f"WANT = {literal(want)}\n\n\n"
               "def run_script(tmp):\n"
               "    src = tmp / 'in put.txt'\n"
               "    src.write_text(HIDDEN)\n"
               "    out = tmp / 'out'\n"
               "    subprocess.run(['bash', SCRIPT, str(src), str(out)], cwd=tmp, timeout=60, capture_output=True)\n"
               "    return out\n\n\n"
               "def check(tmp_path, name):\n"
               "    out = run_script(tmp_path)\n"
               "    assert (out / name).read_text().strip() == WANT[name].strip()\n")
    tests = [f"def test_{k}(tmp_path):\n    check(tmp_path, {fname[k]!r})\n" for k in keys]
    if len(tests) < 8:
        tests.append("def test_default_run_writes_app_out():\n"
                     "    subprocess.run(['bash', SCRIPT], cwd='/tmp', timeout=60, capture_output=True)\n"
                     f"    assert all(os.path.isfile('/app/out/' + n) for n in {literal(sorted(fname.values()))})\n"
                     f"    assert read('/app/out/' + {fname[sorted(buggy)[0]]!r}).strip() == "
                     f"{_sh_expect(sorted(buggy)[0], shown, limit, top, maxlines).strip()!r}\n")
    sol = [f"cat -n {script}", f"head -5 {data}", f"bash {script} && head /app/out/*"] + fixes
    sol += [f"bash {script} && head /app/out/*"]
    intro = pick(rng, [
        f"The script `{script}` summarizes `{data}` into several files under `/app/out`, but some of its outputs "
        "are wrong.",
        f"{say(rng, 'task')} is to debug `{script}`. It reads a file of `<name> <value>` lines (default `{data}`) "
        "and writes one small report file per statistic, yet a few of them come out incorrect.",
        f"Someone wrote `{script}` to compute statistics over `{data}`; a code review found that not every "
        "statistic is computed correctly.",
    ])
    items = [f"`{fname[k]}` must contain {_SH_SECTIONS[k][0].replace('$LIMIT', str(limit)).replace('$TOP', str(top)).replace('$MAXLINES', str(maxlines))}."
             for k in keys]
    items.append(f"The script takes the input file as its first argument and the output folder as its second "
                 "(defaults as now), and must work for any input of this shape, including paths with spaces.")
    outro = (f"Fix the script in place (keep its name and interface). The tests run it on other data. "
             f"{say(rng, 'finally')} run it once with its defaults so `/app/out` is up to date.")
    return TaskDraft(instruction=compose(rng, intro + " Expected outputs:", items, outro=outro), tests=tests,
                     solution=sol, files={script[5:]: text, data[5:]: "".join(f"{n} {v}\n" for n, v in shown)},
                     test_prelude=prelude, build_steps=[f"RUN chmod 755 {script}"], difficulty="medium",
                     tags=("bash", "debugging"))


# ----------------------------------------------------------------------------------------------- python-bugfix

# name -> (doc, body lines, (bad line, good line), test body using F as the function name)
_PY_FUNCS = {
    "median": ("Return the median of a non-empty list of numbers (the mean of the two middle values when the "
               "length is even).",
               ["s = sorted(values)", "n = len(s)", "mid = n // 2", "if n % 2 == 1:", "    return s[mid]",
                "return (s[mid - 1] + s[mid]) / 2"], ("s = list(values)", "s = sorted(values)"), "values",
               "assert F([5, 1, 3]) == 3\n    assert F([4, 1, 3, 2]) == 2.5\n    assert F([7]) == 7"),
    "palindrome": ("Return True if text reads the same backwards, ignoring case and every non-alphanumeric "
                   "character.",
                   ["cleaned = [c.lower() for c in text if c.isalnum()]", "return cleaned == cleaned[::-1]"],
                   ("cleaned = [c for c in text if c.isalnum()]", "cleaned = [c.lower() for c in text if c.isalnum()]"),
                   "text", "assert F('Never odd or even') is True\n    assert F('A man, a plan, a canal: Panama') is True\n"
                   "    assert F('terminal') is False"),
    "word_counts": ("Return a dict mapping each whitespace-separated word of text to its number of occurrences.",
                    ["counts = {}", "for word in text.split():", "    counts[word] = counts.get(word, 0) + 1",
                     "return counts"], ("for word in text.split(' '):", "for word in text.split():"), "text",
                    "assert F('a  b\\na') == {'a': 2, 'b': 1}\n    assert F('') == {}"),
    "chunk": ("Split items into consecutive lists of length size; the last list may be shorter.",
              ["return [items[i:i + size] for i in range(0, len(items), size)]"],
              ("return [items[i:i + size] for i in range(0, len(items) - size, size)]",
               "return [items[i:i + size] for i in range(0, len(items), size)]"), "items, size",
              "assert F([1, 2, 3, 4, 5], 2) == [[1, 2], [3, 4], [5]]\n    assert F([1, 2], 2) == [[1, 2]]\n"
              "    assert F([], 3) == []"),
    "flatten": ("Flatten arbitrarily nested lists into one flat list, keeping the order.",
                ["out = []", "for x in nested:", "    if isinstance(x, list):", "        out.extend(flatten(x))",
                 "    else:", "        out.append(x)", "return out"],
                ("        out.extend(x)", "        out.extend(flatten(x))"), "nested",
                "assert F([1, [2, [3, [4]]], 5]) == [1, 2, 3, 4, 5]\n    assert F([]) == []"),
    "clamp": ("Return x limited to the closed interval [lo, hi].",
              ["return max(lo, min(x, hi))"], ("return min(lo, max(x, hi))", "return max(lo, min(x, hi))"),
              "x, lo, hi", "assert F(5, 0, 10) == 5\n    assert F(-3, 0, 10) == 0\n    assert F(42, 0, 10) == 10"),
    "dedupe": ("Return the items without repeats, keeping the first occurrence of each, in the original order.",
               ["seen = set()", "out = []", "for item in items:", "    if item not in seen:", "        seen.add(item)",
                "        out.append(item)", "return out"], ("return sorted(set(items))", None), "items",
               "assert F(['b', 'a', 'b', 'c', 'a']) == ['b', 'a', 'c']\n    assert F([]) == []"),
    "to_fahrenheit": ("Convert a temperature in degrees Celsius to degrees Fahrenheit.",
                      ["return celsius * 9 / 5 + 32"], ("return (celsius + 32) * 9 / 5", "return celsius * 9 / 5 + 32"),
                      "celsius", "assert F(100) == 212\n    assert F(0) == 32\n    assert F(-40) == -40"),
    "parse_pairs": ("Parse 'key=value' pairs separated by ';' into a dict; whitespace around keys and values is "
                    "stripped, values may themselves contain '=', empty pairs are ignored.",
                    ["out = {}", "for part in text.split(';'):", "    if not part.strip():", "        continue",
                     "    key, _, value = part.partition('=')", "    out[key.strip()] = value.strip()", "return out"],
                    ("    key, value = part.split('=')", "    key, _, value = part.partition('=')"), "text",
                    "assert F('a=1; b = 2;') == {'a': '1', 'b': '2'}\n    assert F('token=ab==;x=') == "
                    "{'token': 'ab==', 'x': ''}"),
    "safe_div": ("Return a / b, or default when b is zero.",
                 ["try:", "    return a / b", "except ZeroDivisionError:", "    return default"],
                 ("except ValueError:", "except ZeroDivisionError:"), "a, b, default=None",
                 "assert F(6, 3) == 2\n    assert F(1, 0) is None\n    assert F(1, 0, default=-1) == -1"),
    "vowels": ("Count the vowels (a, e, i, o, u; either case) in text.",
               ["return sum(1 for c in text.lower() if c in 'aeiou')"],
               ("return sum(1 for c in text if c in 'aeiou')", "return sum(1 for c in text.lower() if c in 'aeiou')"),
               "text", "assert F('Queue') == 4\n    assert F('AEIOU xyz') == 5\n    assert F('') == 0"),
    "running_total": ("Return the list of prefix sums of values (the i-th element is the sum of the first i+1).",
                      ["out = []", "total = 0", "for v in values:", "    total += v", "    out.append(total)",
                       "return out"], ("total = values[0] if values else 0", "total = 0"), "values",
                      "assert F([1, 2, 3]) == [1, 3, 6]\n    assert F([]) == []\n    assert F([5]) == [5]"),
}

_ALIASES = {"median": ["median", "middle_value"], "palindrome": ["is_palindrome", "reads_same_backwards"],
            "word_counts": ["word_counts", "count_words"], "chunk": ["chunk", "batched"],
            "flatten": ["flatten", "flatten_all"], "clamp": ["clamp", "bound"], "dedupe": ["dedupe", "unique_in_order"],
            "to_fahrenheit": ["to_fahrenheit", "c_to_f"], "parse_pairs": ["parse_pairs", "parse_kv"],
            "safe_div": ["safe_div", "divide_or_default"], "vowels": ["count_vowels", "vowel_count"],
            "running_total": ["running_total", "prefix_sums"]}


def _py_function(key: str, fname: str, bug: bool) -> tuple[str, str | None, str | None]:
    doc, body, (bad, good), args, _t = _PY_FUNCS[key]
    body = [ln.replace("flatten(", fname + "(") for ln in body]
    if bug and key == "dedupe":
        body = [bad]
    elif bug:
        good = good.replace("flatten(", fname + "(")
        body = [bad if ln == good else ln for ln in body]
    src = f"def {fname}({args}):\n    \"\"\"{doc}\"\"\"\n" + "".join(f"    {ln}\n" for ln in body)
    return src, ("    " + bad if bug else None), ("    " + (good or "") if bug else None)


@family("python-bugfix", TRAIN, "debugging", "fix injected bugs in a small Python utility module")
def python_bugfix(rng: random.Random) -> TaskDraft:
    pkg = pick(rng, ["utils", "helpers", "toolkit", "common", "lib"])
    mod = pick(rng, ["textops", "numeric", "misc", "core", "tools"])
    path = f"/app/{pkg}/{mod}.py"
    keys = rng.sample(sorted(_PY_FUNCS), rng.randint(4, 7))
    buggy = set(rng.sample(keys, rng.randint(2, min(4, len(keys)))))
    names = {k: pick(rng, _ALIASES[k]) for k in keys}
    srcs, fixes = [], []
    for k in keys:
        src, bad, good = _py_function(k, names[k], k in buggy)
        srcs.append(src)
        if k in buggy and k != "dedupe":
            fixes.append((bad, good))
    text = f'"""{pick(rng, ["Small helpers used across the project.", "Utility functions.", "Shared helpers."])}"""\n\n\n' + \
        "\n\n".join(srcs)
    sol = [f"cat -n {path}", f"cd /app && python3 -c 'import {pkg}.{mod} as m; print([n for n in dir(m) if not n.startswith(\"_\")])'"]
    for bad, good in fixes:
        if text.count(bad) != 1:
            raise AssertionError(f"python-bugfix: bug line not unique: {bad!r}")
        sol.append(sed_replace(path, bad, good))
    if "dedupe" in buggy:
        good_body = "".join(f"    {ln}\n" for ln in _PY_FUNCS["dedupe"][1])
        sol.append(f"python3 - <<'EOF'\np = {path!r}\ns = open(p).read()\n"
                   f"s = s.replace({'    return sorted(set(items))' + chr(10)!r}, {good_body!r})\n"
                   "open(p, 'w').write(s)\nEOF")
    checks = "; ".join(f"print({names[k]!r}, m.{names[k]}.__doc__[:30])" for k in keys[:2])
    sol.append(f"cd /app && python3 -c 'import {pkg}.{mod} as m; {checks}'")
    tests = [f"def test_{names[k]}():\n    from {pkg}.{mod} import {names[k]} as F\n    {_PY_FUNCS[k][4]}\n"
             for k in keys]
    if len(tests) < 8:
        tests.append(f"def test_module_imports_cleanly():\n    import importlib\n    m = importlib.import_module('{pkg}.{mod}')\n"
                     f"    assert all(callable(getattr(m, n)) for n in {literal([names[k] for k in keys])})\n")
    prelude = "import sys\n\nsys.path.insert(0, '/app')\n"
    intro = pick(rng, [
        f"The module `{path}` (importable as `{pkg}.{mod}` from `/app`) has bugs: some functions do not do what "
        "their docstrings say.",
        f"{say(rng, 'task')} is to fix `{pkg}.{mod}` (file `{path}`). Unit tests for it are failing.",
        f"Several helpers in `{path}` misbehave. Their docstrings are the specification.",
    ])
    items = [f"`{names[k]}`: {_PY_FUNCS[k][0]}" for k in keys]
    outro = pick(rng, ["Fix the implementations without renaming functions or changing their signatures.",
                       "Keep function names and signatures; only fix the bodies.",
                       "Do not rename anything; the tests import these names."])
    return TaskDraft(instruction=compose(rng, intro + " Functions and their contracts:", items, outro=outro),
                     tests=tests, solution=sol, files={f"{pkg}/__init__.py": "", f"{pkg}/{mod}.py": text},
                     test_prelude=prelude, image=pick(rng, ["python:3.11-slim-bookworm", "debian:bookworm-slim"]),
                     difficulty="medium", tags=("python", "debugging"))
