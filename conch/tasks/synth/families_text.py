"""Text families: line-oriented processing (grep/sed/awk/sort/uniq), log analysis, and config-file edits.

Expected outputs are computed here in Python with the same rules the instruction states (byte-order sorts,
ties broken by value), and the reference commands use `LC_ALL=C` so they agree in any locale.
"""

from __future__ import annotations

import json
import random
from collections import Counter

from conch.tasks.synth.base import (
    TRAIN,
    TaskDraft,
    compose,
    family,
    heredoc,
    hexid,
    literal,
    pick,
    q,
    say,
    sha256_text,
    words,
)

# ----------------------------------------------------------------------------------------------- text-pipeline

_FIELDS = ("user", "action", "status", "ms", "host")


def _records(rng: random.Random, n: int) -> list[dict[str, str]]:
    users = words(rng, "name", rng.randint(4, 9))
    actions = rng.sample(["login", "logout", "upload", "download", "delete", "share", "search", "view"], 5)
    hosts = [f"srv-{c}" for c in rng.sample("abcdefgh", 4)]
    out = []
    for _ in range(n):
        out.append({"user": pick(rng, users), "action": pick(rng, actions),
                    "status": pick(rng, ["ok", "ok", "ok", "fail", "denied"]),
                    "ms": str(rng.randint(3, 2500)), "host": pick(rng, hosts)})
    return out


@family("text-pipeline", TRAIN, "text-processing", "answer questions about a record file with grep/awk/sort/uniq")
def text_pipeline(rng: random.Random) -> TaskDraft:
    fmt = pick(rng, ["kv", "colon", "tab"])
    name = pick(rng, ["events", "activity", "audit", "journal", "records"]) + pick(rng, [".txt", ".log", ".dat"])
    path = f"/app/data/{name}"
    out = pick(rng, ["/app/out", "/app/results", "/app/answers"])
    recs = _records(rng, rng.randint(60, 400))
    order = list(_FIELDS)
    rng.shuffle(order)
    if fmt == "kv":
        render = lambda r: " ".join(f"{k}={r[k]}" for k in order)  # noqa: E731
        desc = ("whitespace-separated `key=value` pairs, for example `" + render(recs[0]) + "`")
    else:
        sep = ":" if fmt == "colon" else "\t"
        render = lambda r: sep.join(r[k] for k in order)  # noqa: E731
        desc = (f"{'colon' if fmt == 'colon' else 'tab'}-separated fields in this order: "
                + ", ".join(f"`{k}`" for k in order) + " (no header line)")
    text = "".join(render(r) + "\n" for r in recs)
    awk_sep = ":" if fmt == "colon" else "\\t"

    def field_cmd(f: str) -> str:
        if fmt == "kv":
            return f"awk '{{for (i = 1; i <= NF; i++) {{ split($i, kv, \"=\"); if (kv[1] == \"{f}\") print kv[2] }}}}' {q(path)}"
        col = order.index(f) + 1
        return f"awk -F'{':' if fmt == 'colon' else chr(92) + 't'}' '{{print ${col}}}' {q(path)}"

    def match_cmd(f: str, v: str) -> str:
        if fmt == "kv":
            return f"grep -E '(^| ){f}={v}( |$)' {q(path)}"
        col = order.index(f) + 1
        return f"awk -F'{':' if fmt == 'colon' else chr(92) + 't'}' '${col} == \"{v}\"' {q(path)}"

    ops = rng.sample(["filter", "count", "distinct", "sum", "replace", "max"], rng.randint(3, 5))
    items, tests, sol = [], [], [f"head -5 {q(path)}", f"wc -l {q(path)}", f"mkdir -p {out}"]
    for op in ops:
        if op == "filter":
            f = pick(rng, ["action", "user", "host"])
            v = pick(rng, sorted({r[f] for r in recs}))
            fname = f"{f}-{v}.txt"
            want = [render(r) for r in recs if r[f] == v]
            items.append(f"`{out}/{fname}`: every line of the file whose `{f}` is `{v}`, unchanged and in the "
                         "original order.")
            tests.append(f"def test_filter_{f}():\n    assert lines({out + '/' + fname!r}) == {literal(want)}\n")
            sol.append(f"{match_cmd(f, v)} > {out}/{fname}")
        elif op == "count":
            f = pick(rng, ["user", "action", "host"])
            c = Counter(r[f] for r in recs)
            want = [f"{n} {v}" for v, n in sorted(c.items(), key=lambda kv: (-kv[1], kv[0]))]
            items.append(f"`{out}/{f}-counts.txt`: for {say(rng, 'each')} distinct `{f}`, a line `<count> <{f}>` "
                         "(single space), sorted by count descending, ties broken by name ascending.")
            tests.append(f"def test_counts_{f}():\n    assert lines({out + '/' + f + '-counts.txt'!r}) == {literal(want)}\n")
            sol.append(f"{field_cmd(f)} | LC_ALL=C sort | uniq -c | LC_ALL=C sort -k1,1nr -k2,2 | "
                       f"awk '{{print $1, $2}}' > {out}/{f}-counts.txt")
        elif op == "distinct":
            f = pick(rng, ["user", "host", "action"])
            want = sorted({r[f] for r in recs})
            items.append(f"`{out}/{f}s.txt`: the distinct `{f}` values, one per line, sorted alphabetically.")
            tests.append(f"def test_distinct_{f}():\n    assert lines({out + '/' + f + 's.txt'!r}) == {literal(want)}\n")
            sol.append(f"{field_cmd(f)} | LC_ALL=C sort -u > {out}/{f}s.txt")
        elif op == "sum":
            st = pick(rng, ["ok", "fail"])
            want = str(sum(int(r["ms"]) for r in recs if r["status"] == st))
            items.append(f"`{out}/total-ms-{st}.txt`: the sum of the `ms` field over the records whose `status` "
                         f"is `{st}`, as a bare integer.")
            tests.append(f"def test_sum_ms():\n    assert read({out + '/total-ms-' + st + '.txt'!r}).strip() == {want!r}\n")
            if fmt == "kv":
                sol.append(f"{match_cmd('status', st)} | grep -oE '(^| )ms=[0-9]+' | cut -d= -f2 | "
                           f"awk '{{s += $1}} END {{print s + 0}}' > {out}/total-ms-{st}.txt")
            else:
                sol.append(f"awk -F'{awk_sep}' '${order.index('status') + 1} == \"{st}\" {{s += ${order.index('ms') + 1}}}"
                           f" END {{print s + 0}}' {q(path)} > {out}/total-ms-{st}.txt")
        elif op == "replace":
            f = pick(rng, ["host", "user"])
            old = pick(rng, sorted({r[f] for r in recs}))
            new = f"{old}-{pick(rng, ['new', 'v2', 'moved', 'eu'])}"
            want = text.replace(old, new)
            items.append(f"`{out}/{pick(rng, ['rewritten', 'renamed', 'patched'])}.txt`: a copy of the whole file "
                         f"in which every occurrence of the text `{old}` is replaced by `{new}` (the original file "
                         "stays as it is).")
            target = items[-1].split("`")[1]
            tests.append(f"def test_replaced():\n    assert read({target!r}) == {want!r}\n"
                         f"    assert read({path!r}).count({old!r}) > 0\n")
            sol.append(f"sed 's/{old}/{new}/g' {q(path)} > {target}")
        else:
            best = max(int(r["ms"]) for r in recs)
            top = [r for r in recs if int(r["ms"]) == best][0]
            items.append(f"`{out}/slowest.txt`: the single line with the largest `ms` value (if several tie, the "
                         "first of them in file order), unchanged.")
            tests.append(f"def test_slowest():\n    assert lines({out + '/slowest.txt'!r}) == [{render(top)!r}]\n")
            if fmt == "kv":
                sol.append("awk '{for (i = 1; i <= NF; i++) { split($i, kv, \"=\"); if (kv[1] == \"ms\" && "
                           f"kv[2] + 0 > m) {{ m = kv[2] + 0; l = $0 }} }}}} END {{print l}}' {q(path)} > "
                           f"{out}/slowest.txt")
            else:
                sol.append(f"awk -F'{awk_sep}' '${order.index('ms') + 1} > m {{m = ${order.index('ms') + 1}; l = $0}} "
                           f"END {{print l}}' {q(path)} > {out}/slowest.txt")
    sol.append(f"head -3 {out}/*")
    tests.append(f"def test_input_unchanged():\n    assert hashlib.sha256(pathlib.Path({path!r}).read_bytes())"
                 f".hexdigest() == {sha256_text(text)!r}\n    assert os.path.isdir({out!r})\n")
    intro = pick(rng, [
        f"`{path}` holds {len(recs)} records, one per line, as {desc}. {say(rng, 'create')} these files:",
        f"Using standard text tools, answer some questions about `{path}` ({len(recs)} lines; each line is {desc}). "
        "Produce:",
        f"{say(rng, 'task')} is to extract information from the record file `{path}`. Every line is {desc}. "
        "Required outputs:",
    ])
    instruction = compose(rng, intro, items, outro="Output files end with a newline; do not add headers.")
    return TaskDraft(instruction=instruction, tests=tests, solution=sol, files={f"data/{name}": text},
                     tags=("grep", "awk", "sort"))


# ----------------------------------------------------------------------------------------------- log-triage

_MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"]


def _unique_top(counter: Counter) -> str | None:
    top = counter.most_common(2)
    if len(top) == 1 or (len(top) > 1 and top[0][1] > top[1][1]):
        return top[0][0]
    return None


@family("log-triage", TRAIN, "log-analysis", "answer operational questions from web or application logs")
def log_triage(rng: random.Random) -> TaskDraft:
    kind = pick(rng, ["access", "app"])
    rotated = rng.random() < 0.5
    report = pick(rng, ["/app/report.json", "/app/triage.json", "/app/findings.json"])
    n = rng.randint(80, 500)
    day, mon = rng.randint(1, 28), rng.randint(1, 12)
    lines_: list[str] = []
    answers: dict[str, object] = {}
    qs: list[tuple[str, str, str]] = []  # key, question, command
    logname = "access.log" if kind == "access" else pick(rng, ["app.log", "server.log", "service.log"])
    glob = f"/app/logs/{logname}*"
    cat = f"zcat -f {glob}" if rotated else f"cat /app/logs/{logname}"
    if kind == "access":
        ips = [f"10.{rng.randint(0, 255)}.{rng.randint(0, 255)}.{rng.randint(1, 254)}" for _ in range(rng.randint(5, 12))]
        weights = [rng.randint(1, 10) for _ in ips]
        paths = ["/", "/login", "/api/items", "/api/orders", "/static/app.js", "/health", f"/{pick(rng, words(rng, 'fruit', 3))}"]
        recs = []
        for i in range(n):
            ip = rng.choices(ips, weights)[0]
            h, m, s = (i * 86399 // n) // 3600, ((i * 86399 // n) // 60) % 60, (i * 86399 // n) % 60
            method = pick(rng, ["GET", "GET", "GET", "POST"])
            path = pick(rng, paths)
            status = rng.choices([200, 201, 301, 404, 500, 502, 503], [60, 5, 5, 10, 4, 3, 2])[0]
            size = rng.randint(0, 9000)
            recs.append((ip, h, path, status, size))
            lines_.append(f'{ip} - - [{day:02d}/{_MONTHS[mon - 1]}/2024:{h:02d}:{m:02d}:{s:02d} +0000] '
                          f'"{method} {path} HTTP/1.1" {status} {size}')
        hour = pick(rng, sorted({r[1] for r in recs}))
        top_ip = _unique_top(Counter(r[0] for r in recs))
        top_path = _unique_top(Counter(r[2] for r in recs))
        cand = [("total_requests", "the total number of requests", f"{cat} | wc -l", len(recs)),
                ("server_errors", "the number of responses with a 5xx status",
                 f"{cat} | awk '$9 ~ /^5/' | wc -l", sum(1 for r in recs if r[3] >= 500)),
                ("not_found", "the number of 404 responses", f"{cat} | awk '$9 == 404' | wc -l",
                 sum(1 for r in recs if r[3] == 404)),
                ("distinct_ips", "the number of distinct client IP addresses",
                 f"{cat} | awk '{{print $1}}' | sort -u | wc -l", len({r[0] for r in recs})),
                ("bytes_ok", "the total response size in bytes over all 200 responses",
                 f"{cat} | awk '$9 == 200 {{s += $10}} END {{print s + 0}}'", sum(r[4] for r in recs if r[3] == 200)),
                (f"requests_hour_{hour:02d}", f"the number of requests made between {hour:02d}:00:00 and "
                 f"{hour:02d}:59:59", f"{cat} | grep -c ':{hour:02d}:[0-9][0-9]:[0-9][0-9] '",
                 sum(1 for r in recs if r[1] == hour))]
        if top_ip:
            cand.append(("top_ip", "the client IP address that made the most requests (a string)",
                         f"{cat} | awk '{{print $1}}' | sort | uniq -c | sort -rn | head -3", top_ip))
        if top_path:
            cand.append(("top_path", "the most requested path (a string, e.g. `/login`)",
                         f"{cat} | awk '{{print $7}}' | sort | uniq -c | sort -rn | head -3", top_path))
    else:
        comps = words(rng, "component", rng.randint(3, 6))
        msgs = ["connection reset", "timeout waiting for lock", "disk quota exceeded", "cache miss storm",
                "retry budget exhausted", "invalid token", "slow query", "queue backlog growing"]
        recs = []
        for i in range(n):
            t = i * 86399 // n
            lvl = rng.choices(["DEBUG", "INFO", "WARN", "ERROR"], [10, 60, 15, 15])[0]
            comp, msg = pick(rng, comps), pick(rng, msgs)
            ts = f"2024-{mon:02d}-{day:02d} {t // 3600:02d}:{(t // 60) % 60:02d}:{t % 60:02d},{rng.randint(0, 999):03d}"
            recs.append((ts, lvl, comp, msg))
            lines_.append(f"{ts} [{lvl}] {comp}: {msg} (req={hexid(rng)})")
        comp = pick(rng, comps)
        msg = pick(rng, sorted({r[3] for r in recs}))
        errs = [r for r in recs if r[1] == "ERROR"]
        top_comp = _unique_top(Counter(r[2] for r in errs))
        cand = [("error_lines", "the number of ERROR lines", f"{cat} | grep -c '\\[ERROR\\]'", len(errs)),
                ("warn_lines", "the number of WARN lines", f"{cat} | grep -c '\\[WARN\\]'",
                 sum(1 for r in recs if r[1] == "WARN")),
                (f"{comp}_errors", f"the number of ERROR lines from the `{comp}` component",
                 f"{cat} | grep -c '\\[ERROR\\] {comp}:'", sum(1 for r in errs if r[2] == comp)),
                ("first_" + msg.replace(" ", "_"), f"the timestamp (e.g. `2024-01-02 03:04:05,678`) of the "
                 f"earliest line whose message is `{msg}`",
                 f"{cat} | grep ': {msg} (' | sort | head -1",
                 min(r[0] for r in recs if r[3] == msg)),
                ("components", "the number of distinct components that logged anything",
                 f"{cat} | awk '{{print $4}}' | sort -u | wc -l", len({r[2] for r in recs}))]
        if top_comp:
            cand.append(("noisiest_component", "the name of the component with the most ERROR lines (a string)",
                         f"{cat} | grep '\\[ERROR\\]' | awk '{{print $4}}' | sort | uniq -c | sort -rn | head -3",
                         top_comp))
    chosen = rng.sample(cand, min(len(cand), rng.randint(3, 6)))
    items = [f"`{key}`: {question}" for key, question, _cmd, _v in chosen]
    answers = {key: v for key, _q, _c, v in chosen}
    files: dict[str, str] = {}
    steps: list[str] = []
    if rotated:
        cut1, cut2 = sorted(rng.sample(range(10, n - 10), 2))
        parts = [lines_[:cut1], lines_[cut1:cut2], lines_[cut2:]]
        files[f"logs/{logname}.2"] = "\n".join(parts[0]) + "\n"
        files[f"logs/{logname}.1"] = "\n".join(parts[1]) + "\n"
        files[f"logs/{logname}"] = "\n".join(parts[2]) + "\n"
        steps.append(f"RUN gzip -n /app/logs/{logname}.2")
        where = (f"The logs are rotated: `/app/logs/{logname}` is current, `/app/logs/{logname}.1` older and "
                 f"`/app/logs/{logname}.2.gz` (gzip-compressed) the oldest. Consider all three together.")
    else:
        files[f"logs/{logname}"] = "\n".join(lines_) + "\n"
        where = f"The log is `/app/logs/{logname}`."
    what = "web server access log (combined format)" if kind == "access" else "application log"
    intro = pick(rng, [
        f"An incident review needs numbers from a {what}. {where} {say(rng, 'write')} a JSON object to `{report}` "
        "with these keys:",
        f"{where} It is a {what}. {say(rng, 'task')} is to summarize it as a JSON object in `{report}` containing:",
        f"Analyze the {what} on this machine. {where} The answers go into `{report}`, a JSON object with keys:",
    ])
    instruction = compose(rng, intro, items, outro="Numbers must be JSON integers, names JSON strings.",
                          shuffle=True)
    tests = [f"def test_{key}():\n    assert json.loads(read({report!r}))[{key!r}] == {v!r}\n" for key, v in answers.items()]
    sol = [f"ls -la /app/logs", f"{cat} | head -5"] + [cmd for _k, _q, cmd, _v in chosen]
    sol.append(heredoc(report, json.dumps(answers, indent=2)))
    sol.append(f"python3 -m json.tool {report}")
    return TaskDraft(instruction=instruction, tests=tests, solution=sol, files=files, build_steps=steps,
                     tags=("logs", kind), difficulty="medium")


# ----------------------------------------------------------------------------------------------- config-patch

_SECTIONS = {
    "server": ["host", "port", "workers", "timeout", "debug"],
    "database": ["host", "port", "name", "user", "pool_size", "timeout"],
    "cache": ["backend", "ttl", "max_entries", "host", "port"],
    "logging": ["level", "file", "rotate", "max_size"],
    "auth": ["provider", "token_ttl", "allow_signup", "secret_file"],
    "storage": ["path", "quota_mb", "backend", "replicas"],
    "metrics": ["enabled", "port", "interval", "prefix"],
    "smtp": ["host", "port", "sender", "tls"],
}


def _value(rng: random.Random, key: str) -> object:
    if key in ("port",):
        return rng.randint(1025, 65000)
    if key in ("workers", "pool_size", "replicas", "max_entries", "ttl", "token_ttl", "interval", "quota_mb",
               "timeout", "max_size"):
        return rng.randint(2, 900)
    if key in ("debug", "rotate", "allow_signup", "enabled", "tls"):
        return rng.random() < 0.5
    if key == "level":
        return pick(rng, ["debug", "info", "warning", "error"])
    if key == "host":
        return f"{pick(rng, words(rng, 'animal', 3))}.{pick(rng, ['internal', 'local', 'lan'])}"
    if key in ("file", "path", "secret_file"):
        return f"/var/{pick(rng, ['lib', 'log', 'opt'])}/{pick(rng, words(rng, 'project', 3))}/{key}"
    return pick(rng, words(rng, "project", 4)) + "-" + hexid(rng, 3)


def _ini_str(v: object) -> str:
    return ("true" if v else "false") if isinstance(v, bool) else str(v)


@family("config-patch", TRAIN, "config-editing", "apply precise edits to an INI, .env or JSON config file")
def config_patch(rng: random.Random) -> TaskDraft:
    fmt = pick(rng, ["ini", "env", "json"])
    secs = rng.sample(sorted(_SECTIONS), rng.randint(3, 5))
    conf = {s: {k: _value(rng, k) for k in rng.sample(_SECTIONS[s], rng.randint(3, len(_SECTIONS[s])))} for s in secs}
    path = {"ini": f"/app/config/{pick(rng, ['app', 'service', 'settings'])}.ini",
            "env": f"/app/{pick(rng, ['.env', 'config.env', 'runtime.env'])}",
            "json": f"/app/config/{pick(rng, ['settings', 'app', 'config'])}.json"}[fmt]
    ops = ["set", "set", "add", "remove", "section"] if fmt != "env" else ["set", "set", "add", "remove", "comment"]
    ops = rng.sample(ops, rng.randint(3, 5))
    shared = [(s, k) for s in secs for k in conf[s] if sum(k in conf[t] for t in secs) > 1]
    want = {s: dict(kv) for s, kv in conf.items()}
    items, changed, checks, sol = [], set(), [], [f"cat {q(path)}"]
    extra_keys: set[tuple[str, str]] = set()
    envkey = lambda s, k: f"{s}_{k}".upper()  # noqa: E731
    py_edit = lambda code: f"python3 - <<'EOF'\nimport json\np = {path!r}\nd = json.load(open(p))\n{code}\njson.dump(d, open(p, 'w'), indent=2)\nEOF"  # noqa: E731,E501
    for op in ops:
        free = [(s, k) for s in secs for k in conf[s] if (s, k) not in changed]
        if op == "set":
            s, k = pick(rng, [c for c in shared if c not in changed] or free)
            v = _value(rng, k)
            while v == conf[s][k]:
                v = _value(rng, k)
            changed.add((s, k))
            want[s][k] = v
            name = f"`{envkey(s, k)}`" if fmt == "env" else f"`{k}` in the `{s}` section"
            items.append(f"Set {name} to `{_ini_str(v) if fmt != 'json' else json.dumps(v)}`.")
            checks.append(("set", s, k))
            if fmt == "ini":
                sol.append(f"sed -i '/^\\[{s}\\]/,/^\\[/ s|^{k} *=.*|{k} = {_ini_str(v)}|' {q(path)}")
            elif fmt == "env":
                sol.append(f"sed -i 's|^{envkey(s, k)}=.*|{envkey(s, k)}={_ini_str(v)}|' {q(path)}")
            else:
                sol.append(py_edit(f"d[{s!r}][{k!r}] = {v!r}"))
        elif op == "add":
            s = pick(rng, secs)
            missing = [k for k in _SECTIONS[s] if k not in conf[s]]
            k = pick(rng, missing) if missing else f"{pick(rng, ['retry', 'grace', 'burst'])}_limit"
            v = _value(rng, k)
            want[s][k] = v
            extra_keys.add((s, k))
            name = f"`{envkey(s, k)}`" if fmt == "env" else f"a key `{k}` to the `{s}` section"
            items.append(f"Add {name} with value `{_ini_str(v) if fmt != 'json' else json.dumps(v)}`" +
                         (" (a new variable)." if fmt == "env" else "."))
            checks.append(("add", s, k))
            if fmt == "ini":
                sol.append(f"sed -i '/^\\[{s}\\]/a {k} = {_ini_str(v)}' {q(path)}")
            elif fmt == "env":
                sol.append(f"echo '{envkey(s, k)}={_ini_str(v)}' >> {q(path)}")
            else:
                sol.append(py_edit(f"d[{s!r}][{k!r}] = {v!r}"))
        elif op in ("remove", "comment"):
            s, k = pick(rng, free)
            changed.add((s, k))
            del want[s][k]
            checks.append((op, s, k))
            if op == "comment":
                items.append(f"Comment out `{envkey(s, k)}` (prefix its line with `# `) instead of deleting it.")
                sol.append(f"sed -i 's|^{envkey(s, k)}=|# {envkey(s, k)}=|' {q(path)}")
                continue
            name = f"`{envkey(s, k)}`" if fmt == "env" else f"the `{k}` key from the `{s}` section"
            items.append(f"Remove {name} entirely.")
            if fmt == "ini":
                sol.append(f"sed -i '/^\\[{s}\\]/,/^\\[/ {{/^{k} *=/d}}' {q(path)}")
            elif fmt == "env":
                sol.append(f"sed -i '/^{envkey(s, k)}=/d' {q(path)}")
            else:
                sol.append(py_edit(f"del d[{s!r}][{k!r}]"))
        else:
            s = pick(rng, [t for t in sorted(_SECTIONS) if t not in secs])
            keys = rng.sample(_SECTIONS[s], 2)
            new = {k: _value(rng, k) for k in keys}
            want[s] = new
            checks.append(("section", s, ""))
            shown = ", ".join(f"`{k}` = `{_ini_str(v) if fmt != 'json' else json.dumps(v)}`" for k, v in new.items())
            items.append(f"Add a new section `{s}` with {shown}" + (" (as a nested object)." if fmt == "json" else "."))
            if fmt == "ini":
                sol.append(f"printf '\\n[{s}]\\n" + "".join(f"{k} = {_ini_str(v)}\\n" for k, v in new.items()) +
                           f"' >> {q(path)}")
            else:
                sol.append(py_edit(f"d[{s!r}] = {new!r}"))
    sol.append(f"cat {q(path)}")
    if fmt == "ini":
        text = f"; {pick(rng, ['Service configuration', 'Main settings', 'Runtime config'])}\n"
        for s in secs:
            text += f"\n# {s} settings\n[{s}]\n" + "".join(f"{k} = {_ini_str(v)}\n" for k, v in conf[s].items())
        parse = ("def load():\n    import configparser\n    cp = configparser.ConfigParser(interpolation=None)\n"
                 "    assert cp.read(PATH)\n    return {s: dict(cp[s]) for s in cp.sections()}\n")
        norm = {s: {k: _ini_str(v) for k, v in kv.items()} for s, kv in want.items()}
    elif fmt == "env":
        text = "# environment for the service\n" + "".join(
            f"{envkey(s, k)}={_ini_str(v)}\n" for s in secs for k, v in conf[s].items())
        parse = ("def load():\n    out = {}\n    for ln in lines(PATH):\n"
                 "        if ln.strip() and not ln.lstrip().startswith('#'):\n"
                 "            k, _, v = ln.partition('=')\n            out[k.strip()] = v.strip()\n"
                 "    return {'': out}\n")
        norm = {"": {envkey(s, k): _ini_str(v) for s, kv in want.items() for k, v in kv.items()}}
    else:
        text = json.dumps(conf, indent=2) + "\n"
        parse = "def load():\n    return json.loads(read(PATH))\n"
        norm = want
    tests = []
    for i, (op, s, k) in enumerate(checks):
        sec, key = ("", envkey(s, k)) if fmt == "env" else (s, k)
        if op in ("set", "add"):
            tests.append(f"def test_{op}_{i}():\n    assert load()[{sec!r}][{key!r}] == {norm[sec][key]!r}\n")
        elif op == "remove":
            tests.append(f"def test_removed_{i}():\n    assert {key!r} not in load()[{sec!r}]\n"
                         f"    assert {literal(sorted(norm[sec]))}[0] in load()[{sec!r}]\n")
        elif op == "comment":
            tests.append(f"def test_commented_{i}():\n    assert {key!r} not in load()['']\n"
                         f"    assert any(ln.startswith('#') and {key + '='!r} in ln for ln in lines(PATH))\n")
        else:
            tests.append(f"def test_new_section():\n    assert load()[{s!r}] == {norm[s]!r}\n")
    touched = {(s, k) for _op, s, k in checks}
    keep = {(("" if fmt == "env" else s), (envkey(s, k) if fmt == "env" else k)): v
            for s in secs for k, v in conf[s].items() if (s, k) not in touched}
    tests.append("def test_other_settings_unchanged():\n    cfg = load()\n"
                 f"    for (sec, key), value in {literal({k: (_ini_str(v) if fmt != 'json' else v) for k, v in keep.items()})}.items():\n"
                 "        assert cfg[sec][key] == value, (sec, key)\n"
                 f"    assert len(cfg) == {len(norm)}\n")
    kind = {"ini": "INI file", "env": "environment file (`KEY=value` lines)", "json": "JSON file"}[fmt]
    intro = pick(rng, [
        f"The service reads its configuration from the {kind} `{path}`. Make these changes:",
        f"{say(rng, 'task')} is to update `{path}` (an {kind}) as follows:" if fmt != "json" else
        f"{say(rng, 'task')} is to update the JSON configuration `{path}` as follows:",
        f"A change request came in for `{path}`. Apply it:",
    ])
    outro = pick(rng, ["Leave every other setting exactly as it is.",
                       "All other settings must keep their current values.",
                       "Change nothing else in the file."])
    if fmt == "ini":
        outro += " Several sections share key names; only touch the section named."
    return TaskDraft(instruction=compose(rng, intro, items, outro=outro), tests=tests, solution=sol,
                     files={path[5:]: text}, test_prelude=f"PATH = {path!r}\n\n\n{parse}", tags=("config", fmt))
