"""Structured-data families: CSV aggregation, JSON reshaping, joining two CSV files.

Money is kept in integer cents here so the expected sums are exact and agree with what awk's `%.2f` prints;
no family asks for averages, whose half-way rounding differs between tools.
"""

from __future__ import annotations

import csv
import io
import json
import random
from collections import Counter, defaultdict

from conch.tasks.synth.base import (
    HELDOUT,
    TRAIN,
    TaskDraft,
    compose,
    family,
    hexid,
    literal,
    pick,
    q,
    say,
    words,
)

_THEMES = {
    "sales": ("region", "product", "units", "unit_price"),
    "grades": ("student", "course", "credits", "fee"),
    "inventory": ("warehouse", "sku", "qty", "unit_cost"),
    "shipments": ("carrier", "destination", "parcels", "rate"),
}


def _money(cents: int) -> str:
    return f"{cents // 100}.{cents % 100:02d}"


def _pyscript(body: str) -> str:
    return "python3 - <<'EOF'\nimport csv, json\n" + body.strip() + "\nEOF"


@family("csv-aggregate", TRAIN, "data-wrangling", "filter and aggregate a CSV file into new CSV/text outputs")
def csv_aggregate(rng: random.Random) -> TaskDraft:
    theme = pick(rng, sorted(_THEMES))
    g, k2, num, dec = _THEMES[theme]
    cols = [g, k2, num, dec]
    rng.shuffle(cols)
    variant = pick(rng, ["plain", "plain", "semicolon", "crlf", "quoted"])
    sep = ";" if variant == "semicolon" else ","
    groups = words(rng, "city", rng.randint(3, 6))
    items2 = [f"{w}-{hexid(rng, 3)}" for w in words(rng, "fruit", rng.randint(6, 14))]
    if variant == "quoted":
        items2 = [f"{w}, {pick(rng, ['large', 'small', 'eu', 'v2'])}" for w in items2]
    rows = []
    used_dec: set[int] = set()
    for _ in range(rng.randint(30, 250)):
        cents = rng.randint(50, 99999)
        while cents in used_dec:
            cents = rng.randint(50, 99999)
        used_dec.add(cents)
        rows.append({g: pick(rng, groups), k2: pick(rng, items2), num: rng.randint(1, 80), dec: cents})
    buf = io.StringIO()
    w = csv.writer(buf, delimiter=sep, lineterminator="\r\n" if variant == "crlf" else "\n",
                   quoting=csv.QUOTE_MINIMAL)
    w.writerow(cols)
    for r in rows:
        w.writerow([_money(r[c]) if c == dec else r[c] for c in cols])
    text = buf.getvalue()
    name = f"{theme}-{pick(rng, ['2023', '2024', 'q3', 'export'])}.csv"
    path = f"/app/data/{name}"
    out = pick(rng, ["/app/out", "/app/reports", "/app/output"])
    ci = {c: cols.index(c) + 1 for c in cols}
    use_py = variant == "quoted"
    clean = path if variant != "crlf" else "/tmp/clean.csv"
    sol = [f"head -5 {q(path)}", f"wc -l {q(path)}", f"mkdir -p {out}"]
    if variant == "crlf":
        sol += [f"head -2 {q(path)} | od -c | head -5", f"tr -d '\\r' < {q(path)} > {clean}"]
    load = f"rows = list(csv.DictReader(open({path!r}, newline=''), delimiter={sep!r}))\n"
    ops = rng.sample(["totals", "revenue", "filter", "top", "distinct", "max"], rng.randint(3, 5))
    items, tests = [], []
    for op in ops:
        if op == "totals":
            tot = defaultdict(int)
            for r in rows:
                tot[r[g]] += r[num]
            want = [f"{g},total_{num}"] + [f"{k},{tot[k]}" for k in sorted(tot)]
            items.append(f"`{out}/{num}_by_{g}.csv`: header `{g},total_{num}`, then one row per {g} with the sum "
                         f"of `{num}`, rows sorted by {g}.")
            tests.append(f"def test_totals():\n    assert lines({out + '/' + num + '_by_' + g + '.csv'!r}) == {literal(want)}\n")
            dst = f"{out}/{num}_by_{g}.csv"
            if use_py:
                sol.append(_pyscript(load + "t = {}\nfor r in rows:\n    t[r[%r]] = t.get(r[%r], 0) + int(r[%r])\n"
                                     "with open(%r, 'w') as f:\n    f.write(%r)\n    for k in sorted(t):\n"
                                     "        f.write(f'{k},{t[k]}\\n')" % (g, g, num, dst, f"{g},total_{num}\n")))
            else:
                sol.append(f"{{ echo '{g},total_{num}'; awk -F'{sep}' 'NR > 1 {{t[${ci[g]}] += ${ci[num]}}} END "
                           f"{{for (k in t) print k \",\" t[k]}}' {clean} | LC_ALL=C sort; }} > {dst}")
        elif op == "revenue":
            tot = defaultdict(int)
            for r in rows:
                tot[r[g]] += r[num] * r[dec]
            want = [f"{g},amount"] + [f"{k},{_money(tot[k])}" for k in sorted(tot)]
            dst = f"{out}/amount_by_{g}.csv"
            items.append(f"`{dst}`: header `{g},amount`, then per {g} the sum of `{num}` × `{dec}` over its rows, "
                         f"written with exactly two decimals, rows sorted by {g}.")
            tests.append(f"def test_amounts():\n    assert lines({dst!r}) == {literal(want)}\n")
            if use_py:
                sol.append(_pyscript(load + "from decimal import Decimal\nt = {}\nfor r in rows:\n"
                                     "    t[r[%r]] = t.get(r[%r], 0) + int(r[%r]) * Decimal(r[%r])\n"
                                     "with open(%r, 'w') as f:\n    f.write(%r)\n    for k in sorted(t):\n"
                                     "        f.write(f'{k},{t[k]:.2f}\\n')" % (g, g, num, dec, dst, f"{g},amount\n")))
            else:
                sol.append(f"{{ echo '{g},amount'; awk -F'{sep}' 'NR > 1 {{t[${ci[g]}] += ${ci[num]} * ${ci[dec]}}} "
                           f"END {{for (k in t) printf \"%s,%.2f\\n\", k, t[k]}}' {clean} | LC_ALL=C sort; }} > {dst}")
        elif op == "filter":
            lim = rng.randint(20, 60)
            keep = [r for r in rows if r[num] >= lim]
            buf = io.StringIO()
            w = csv.writer(buf, delimiter=sep, lineterminator="\n")
            w.writerow(cols)
            for r in keep:
                w.writerow([_money(r[c]) if c == dec else r[c] for c in cols])
            dst = f"{out}/{num}_at_least_{lim}.csv"
            items.append(f"`{dst}`: the header plus every row whose `{num}` is at least {lim}, in the original "
                         f"order and column layout (same `{sep}` delimiter{', same quoting' if use_py else ''}, "
                         "`\\n` line endings).")
            tests.append(f"def test_filtered():\n    assert read({dst!r}) == {buf.getvalue()!r}\n")
            if use_py:
                sol.append(_pyscript(f"src = csv.reader(open({path!r}, newline=''), delimiter={sep!r})\n"
                                     f"w = csv.writer(open({dst!r}, 'w', newline=''), delimiter={sep!r}, "
                                     "lineterminator='\\n')\nw.writerow(next(src))\nfor r in src:\n"
                                     f"    if int(r[{ci[num] - 1}]) >= {lim}:\n        w.writerow(r)"))
            else:
                sol.append(f"awk -F'{sep}' 'NR == 1 || ${ci[num]} >= {lim}' {clean} > {dst}")
        elif op == "top":
            n = rng.randint(3, 6)
            top = sorted(rows, key=lambda r: -r[dec])[:n]
            dst = f"{out}/top{n}.txt"
            items.append(f"`{dst}`: the `{k2}` values of the {n} rows with the highest `{dec}`, one per line, "
                         "highest first (values are distinct).")
            tests.append(f"def test_top():\n    assert lines({dst!r}) == {literal([r[k2] for r in top])}\n")
            if use_py:
                sol.append(_pyscript(load + f"rows.sort(key=lambda r: -float(r[{dec!r}]))\n"
                                     f"open({dst!r}, 'w').write(''.join(r[{k2!r}] + '\\n' for r in rows[:{n}]))"))
            else:
                sol.append(f"tail -n +2 {clean} | sort -t'{sep}' -k{ci[dec]},{ci[dec]}gr | head -{n} | "
                           f"cut -d'{sep}' -f{ci[k2]} > {dst}")
        elif op == "distinct":
            dst = f"{out}/distinct_{k2}.txt"
            items.append(f"`{dst}`: the number of distinct `{k2}` values, as a bare integer.")
            tests.append(f"def test_distinct():\n    assert read({dst!r}).strip() == {str(len({r[k2] for r in rows}))!r}\n")
            if use_py:
                sol.append(_pyscript(load + f"open({dst!r}, 'w').write(str(len({{r[{k2!r}] for r in rows}})) + '\\n')"))
            else:
                sol.append(f"tail -n +2 {clean} | cut -d'{sep}' -f{ci[k2]} | sort -u | wc -l > {dst}")
        else:
            best: dict[str, int] = {}
            for r in rows:
                best[r[g]] = max(best.get(r[g], 0), r[num])
            dst = f"{out}/max_{num}.txt"
            items.append(f"`{dst}`: lines `<{g}> <max {num}>` (space-separated) giving the largest `{num}` of each "
                         f"{g}, sorted by {g}.")
            tests.append(f"def test_max():\n    assert lines({dst!r}) == {literal([f'{k} {best[k]}' for k in sorted(best)])}\n")
            if use_py:
                sol.append(_pyscript(load + f"m = {{}}\nfor r in rows:\n    m[r[{g!r}]] = max(m.get(r[{g!r}], 0), "
                                     f"int(r[{num!r}]))\nopen({dst!r}, 'w').write(''.join(f'{{k}} {{m[k]}}\\n' "
                                     "for k in sorted(m)))"))
            else:
                sol.append(f"awk -F'{sep}' 'NR > 1 && ${ci[num]} > m[${ci[g]}] {{m[${ci[g]}] = ${ci[num]}}} END "
                           f"{{for (k in m) print k, m[k]}}' {clean} | LC_ALL=C sort > {dst}")
    sol.append(f"head -n 4 {out}/*")
    note = {"plain": "", "semicolon": " Fields are separated by semicolons.",
            "crlf": " The file was exported on Windows and has CRLF line endings.",
            "quoted": f" Some `{k2}` values contain commas and are quoted."}[variant]
    intro = pick(rng, [
        f"`{path}` is a CSV export with a header row ({', '.join(cols)}).{note} {say(rng, 'create')} the following:",
        f"{say(rng, 'task')} is to summarize the spreadsheet export `{path}`.{note} Its columns are "
        f"{', '.join(f'`{c}`' for c in cols)}. Outputs:",
        f"Crunch the numbers in `{path}` (header: {sep.join(cols)}).{note} Write:",
    ])
    outro = "Sorting means plain byte order (`LC_ALL=C`). Outputs use `\\n` line endings."
    return TaskDraft(instruction=compose(rng, intro, items, outro=outro), tests=tests, solution=sol,
                     files={f"data/{name}": text}, tags=("csv", variant))


# ----------------------------------------------------------------------------------------------- json-reshape


@family("json-reshape", TRAIN, "data-wrangling", "filter, group and flatten JSON records")
def json_reshape(rng: random.Random) -> TaskDraft:
    jsonl = rng.random() < 0.4
    teams = words(rng, "project", rng.randint(3, 5))
    cities = words(rng, "city", 5)
    tags_pool = words(rng, "color", 6)
    people = []
    pool = [f"{a}-{b}" for a in words(rng, "name", 12) for b in words(rng, "animal", 5)]
    for nm in rng.sample(pool, rng.randint(15, 60)):
        people.append({"id": 0, "name": nm, "team": pick(rng, teams), "active": rng.random() < 0.7,
                       "address": {"city": pick(rng, cities), "zip": f"{rng.randint(10000, 99999)}"},
                       "tags": rng.sample(tags_pool, rng.randint(0, 3)), "score": 0})
    ids = rng.sample(range(100, 10000), len(people))
    scores = rng.sample(range(0, 100000), len(people))
    for p, i, s in zip(people, ids, scores):
        p["id"], p["score"] = i, s
    rng.shuffle(people)
    name = pick(rng, ["people", "members", "staff", "users"])
    path = f"/app/data/{name}.{'jsonl' if jsonl else 'json'}"
    text = "".join(json.dumps(p) + "\n" for p in people) if jsonl else json.dumps(people, indent=2) + "\n"
    out = pick(rng, ["/app/out", "/app/export", "/app/derived"])
    load = (f"recs = [json.loads(l) for l in open({path!r}) if l.strip()]\n" if jsonl
            else f"recs = json.load(open({path!r}))\n")
    ops = rng.sample(["filter", "count", "flatten", "best", "tags", "index"], rng.randint(3, 5))
    items, tests, sol = [], [], [f"head -c 600 {q(path)}", f"mkdir -p {out}"]
    for op in ops:
        if op == "filter":
            t = pick(rng, teams)
            want = [{"id": p["id"], "name": p["name"]} for p in sorted(people, key=lambda p: p["id"])
                    if p["active"] and p["team"] == t]
            dst = f"{out}/active-{t}.json"
            items.append(f"`{dst}`: a JSON array of objects `{{\"id\": ..., \"name\": ...}}` (only those two keys) "
                         f"for the active records of team `{t}`, sorted by id ascending.")
            tests.append(f"def test_filter():\n    assert json.loads(read({dst!r})) == {want!r}\n")
            sol.append(_pyscript(load + f"sel = sorted((r for r in recs if r['active'] and r['team'] == {t!r}), "
                                 "key=lambda r: r['id'])\n"
                                 f"json.dump([{{'id': r['id'], 'name': r['name']}} for r in sel], open({dst!r}, 'w'), "
                                 "indent=2)"))
        elif op == "count":
            c = dict(sorted(Counter(p["address"]["city"] for p in people).items()))
            dst = f"{out}/per-city.json"
            items.append(f"`{dst}`: a JSON object mapping each city (`address.city`) to its number of records.")
            tests.append(f"def test_count():\n    assert json.loads(read({dst!r})) == {c!r}\n")
            sol.append(_pyscript(load + "from collections import Counter\n"
                                 f"json.dump(Counter(r['address']['city'] for r in recs), open({dst!r}, 'w'))"))
        elif op == "flatten":
            dst = f"{out}/{name}.csv"
            want = ["id,name,team,city"] + [f"{p['id']},{p['name']},{p['team']},{p['address']['city']}"
                                            for p in sorted(people, key=lambda p: p["id"])]
            items.append(f"`{dst}`: CSV with header `id,name,team,city` (city from `address.city`), one row per "
                         "record, sorted by id ascending.")
            tests.append(f"def test_flatten():\n    assert lines({dst!r}) == {literal(want)}\n")
            sol.append(_pyscript(load + f"with open({dst!r}, 'w') as f:\n    f.write('id,name,team,city\\n')\n"
                                 "    for r in sorted(recs, key=lambda r: r['id']):\n"
                                 "        f.write(f\"{r['id']},{r['name']},{r['team']},{r['address']['city']}\\n\")"))
        elif op == "best":
            t = pick(rng, teams)
            members = [p for p in people if p["team"] == t] or people
            top = max(members, key=lambda p: p["score"])
            dst = f"{out}/top-scorer.txt"
            scope = f"in team `{t}`" if members is not people else "overall"
            items.append(f"`{dst}`: the `name` of the record with the highest `score` {scope}, on one line.")
            tests.append(f"def test_best():\n    assert read({dst!r}).strip() == {top['name']!r}\n")
            flt = f"[r for r in recs if r['team'] == {t!r}]" if members is not people else "recs"
            sol.append(_pyscript(load + f"open({dst!r}, 'w').write(max({flt}, key=lambda r: r['score'])['name'] + '\\n')"))
        elif op == "tags":
            want = sorted({t for p in people for t in p["tags"]})
            dst = f"{out}/tags.txt"
            items.append(f"`{dst}`: every distinct tag used in any record's `tags` list, one per line, sorted.")
            tests.append(f"def test_tags():\n    assert lines({dst!r}) == {want!r}\n")
            sol.append(_pyscript(load + f"open({dst!r}, 'w').write(''.join(t + '\\n' for t in sorted({{t for r in recs "
                                 "for t in r['tags']})))"))
        else:
            dst = f"{out}/by-id.json"
            want = {str(p["id"]): p["name"] for p in people if not p["active"]}
            items.append(f"`{dst}`: a JSON object mapping the id (as a string key) of every inactive record to its "
                         "name.")
            tests.append(f"def test_index():\n    assert json.loads(read({dst!r})) == {literal(want)}\n")
            sol.append(_pyscript(load + f"json.dump({{str(r['id']): r['name'] for r in recs if not r['active']}}, "
                                 f"open({dst!r}, 'w'))"))
    sol.append(f"ls -la {out}")
    shape = ("JSON Lines (one object per line)" if jsonl else "a JSON array of objects")
    intro = pick(rng, [
        f"`{path}` holds {len(people)} records as {shape}. Each has `id`, `name`, `team`, `active`, `address` "
        "(with `city` and `zip`), `tags` and `score`. Produce:",
        f"{say(rng, 'task')} is to reshape the records in `{path}` ({shape}; fields `id`, `name`, `team`, "
        "`active`, `address.city`, `address.zip`, `tags`, `score`) into these files:",
        f"Derive some views of `{path}`, which contains {shape}. {say(rng, 'create')}:",
    ])
    return TaskDraft(instruction=compose(rng, intro, items), tests=tests, solution=sol,
                     files={path[5:]: text}, tags=("json", "jsonl" if jsonl else "array"))


# ----------------------------------------------------------------------------------------------- csv-join


@family("csv-join", HELDOUT, "data-wrangling", "join two CSV files on a key and report totals and orphans")
def csv_join(rng: random.Random) -> TaskDraft:
    left, right = pick(rng, [("customers", "orders"), ("accounts", "payments"), ("clients", "invoices")])
    lid = left[:-1] + "_id"
    names = rng.sample([f"{a}-{b}" for a in words(rng, "name", 10) for b in words(rng, "color", 5)],
                       rng.randint(6, 20))
    countries = words(rng, "city", 4)
    ids = rng.sample(range(1, 999), len(names))
    custs = [{"id": i, "name": n, "region": pick(rng, countries)} for i, n in zip(ids, names)]
    rows = []
    for j in range(rng.randint(20, 150)):
        if rng.random() < 0.08:
            cid = rng.randint(1000, 1999)
        else:
            cid = pick(rng, custs)["id"]
        rows.append({"ref": f"{right[:3].upper()}-{j + 1:05d}", lid: cid, "cents": rng.randint(100, 500000)})
    if not any(r[lid] >= 1000 for r in rows):
        rows[0][lid] = 1500
    known = {c["id"] for c in custs}
    ltext = "id,name,region\n" + "".join(f"{c['id']},{c['name']},{c['region']}\n" for c in custs)
    rtext = f"ref,{lid},amount\n" + "".join(f"{r['ref']},{r[lid]},{_money(r['cents'])}\n" for r in rows)
    out = pick(rng, ["/app/out", "/app/joined", "/app/report"])
    lp, rp = f"/app/data/{left}.csv", f"/app/data/{right}.csv"
    per = {c["id"]: [0, 0] for c in custs}
    for r in rows:
        if r[lid] in per:
            per[r[lid]][0] += 1
            per[r[lid]][1] += r["cents"]
    by_name = {c["id"]: c for c in custs}
    summary = ["id,name,count,total"] + [f"{i},{by_name[i]['name']},{per[i][0]},{_money(per[i][1])}" for i in sorted(per)]
    orphans = sorted(r["ref"] for r in rows if r[lid] not in known)
    region_tot: dict[str, int] = defaultdict(int)
    for i, (n, c) in per.items():
        region_tot[by_name[i]["region"]] += c
    regions = [f"{k},{_money(v)}" for k, v in sorted(region_tot.items(), key=lambda kv: (-kv[1], kv[0]))]
    idle = sorted(by_name[i]["name"] for i in per if per[i][0] == 0)
    items = [f"`{out}/summary.csv`: header `id,name,count,total` and one row per {left[:-1]} (all of them, also "
             f"those without {right}), sorted by numeric id; `count` is the number of {right}, `total` their "
             "summed amount with two decimals (`0.00` when none).",
             f"`{out}/orphans.txt`: the `ref` of every {right[:-1]} whose `{lid}` matches no {left[:-1]}, one per "
             "line, sorted.",
             f"`{out}/regions.csv`: lines `<region>,<total>` (no header) with the summed amount per region, largest "
             "total first, ties by region name.",
             f"`{out}/idle.txt`: the names of {left} with no {right}, sorted, one per line (empty file if none)."]
    tests = [f"def test_summary():\n    assert lines({out + '/summary.csv'!r}) == {literal(summary)}\n",
             f"def test_orphans():\n    assert lines({out + '/orphans.txt'!r}) == {literal(orphans)}\n",
             f"def test_regions():\n    assert lines({out + '/regions.csv'!r}) == {literal(regions)}\n",
             f"def test_idle():\n    assert lines({out + '/idle.txt'!r}) == {literal(idle)}\n"]
    sol = [f"head -3 {lp} {rp}", f"wc -l {lp} {rp}", f"mkdir -p {out}",
           f"awk -F, 'NR == FNR {{ if (FNR > 1) seen[$1] = 1; next }} FNR > 1 && !($2 in seen) {{print $1}}' {lp} {rp} "
           f"| LC_ALL=C sort > {out}/orphans.txt",
           _pyscript(f"""
from decimal import Decimal
custs = list(csv.DictReader(open({lp!r})))
rows = list(csv.DictReader(open({rp!r})))
per = {{int(c['id']): [0, Decimal(0)] for c in custs}}
for r in rows:
    k = int(r[{lid!r}])
    if k in per:
        per[k][0] += 1
        per[k][1] += Decimal(r['amount'])
name = {{int(c['id']): c['name'] for c in custs}}
region = {{int(c['id']): c['region'] for c in custs}}
with open({out + '/summary.csv'!r}, 'w') as f:
    f.write('id,name,count,total\\n')
    for k in sorted(per):
        f.write(f'{{k}},{{name[k]}},{{per[k][0]}},{{per[k][1]:.2f}}\\n')
tot = {{}}
for k, (n, s) in per.items():
    tot[region[k]] = tot.get(region[k], 0) + s
with open({out + '/regions.csv'!r}, 'w') as f:
    for reg, s in sorted(tot.items(), key=lambda kv: (-kv[1], kv[0])):
        f.write(f'{{reg}},{{s:.2f}}\\n')
with open({out + '/idle.txt'!r}, 'w') as f:
    f.write(''.join(n + '\\n' for n in sorted(name[k] for k in per if per[k][0] == 0)))
"""), f"head {out}/*"]
    intro = pick(rng, [
        f"Two CSV files describe the same business: `{lp}` (`id,name,region`) and `{rp}` (`ref,{lid},amount`). "
        "Join them and write:",
        f"{say(rng, 'task')} is to reconcile `{rp}` against `{lp}` — every row of the former refers to a row of "
        f"the latter through `{lid}`, except some that are broken. Produce:",
        f"Combine `{lp}` with `{rp}` (joined on `{left}.id` = `{right}.{lid}`) into these reports:",
    ])
    return TaskDraft(instruction=compose(rng, intro, items, shuffle=True), tests=tests, solution=sol,
                     files={f"data/{left}.csv": ltext, f"data/{right}.csv": rtext}, difficulty="medium",
                     tags=("csv", "join"))
