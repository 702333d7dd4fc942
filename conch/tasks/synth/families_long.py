"""Long-horizon batch families: many independent items, each needing its own look and its own command.

`batch-tickets` (train) answers N tickets about N files; `manifest-audit` (heldout) verifies K releases
against their checksum manifests. The reference solution reads each item and then acts on it, so its length
grows with N (up to ~300 turns), and the tests grade groups of items so partial progress shows.
"""

from __future__ import annotations

import random

from conch.tasks.synth.base import (
    HELDOUT,
    TRAIN,
    TaskDraft,
    build_time_tree,
    compose,
    family,
    heredoc,
    literal,
    pick,
    q,
    say,
)

_TICKET_CODE = '''
VOCAB = ["error", "warning", "timeout", "retry", "success", "pending", "failed", "cached", "stale", "ok"]


def plan(P):
    r = Rand(P["seed"])
    files, data = {}, []
    for i in range(P["nfiles"]):
        if r.randint(0, 3) == 0:
            name = "nums-" + r.word(4) + ".txt"
            content = "".join(str(r.randint(-50, 999)) + "\\n" for _ in range(r.randint(3, 25)))
        else:
            name = r.word(r.randint(4, 7)) + r.choice([".txt", ".log", ".md"])
            content = "".join(" ".join(r.choice(VOCAB) if r.randint(0, 2) == 0 else r.word(r.randint(2, 7))
                                       for _ in range(r.randint(1, 9))) + "\\n" for _ in range(r.randint(3, 30)))
        if name in dict(data):
            name = str(i) + "-" + name
        data.append((name, content))
        files[P["files"] + "/" + name] = content
    tickets, seen = [], set()
    while len(tickets) < P["n"]:
        tid = P["prefix"] + "-" + r.word(4, "0123456789abcdef")
        if tid in seen:
            continue
        seen.add(tid)
        name, content = r.choice(data)
        path = "/app/" + P["files"] + "/" + name
        rows = content.splitlines()
        kinds = ["words", "bytes", "sha256", "line", "grep"] + (["sum"] if name.startswith("nums-") else [])
        kind = r.choice(kinds)
        arg = ""
        if kind == "words":
            q, ans = "How many words (whitespace-separated) are in " + path + "?", len(content.split())
        elif kind == "bytes":
            q, ans = "What is the size of " + path + " in bytes?", len(content.encode())
        elif kind == "sha256":
            q, ans = "What is the SHA-256 hex digest of " + path + "?", hashlib.sha256(content.encode()).hexdigest()
        elif kind == "line":
            k = r.randint(1, len(rows))
            arg = str(k)
            q, ans = "What is line " + arg + " of " + path + " (exact text)?", rows[k - 1]
        elif kind == "grep":
            arg = r.choice(VOCAB)
            q = "How many lines of " + path + " contain the word '" + arg + "' (as a substring)?"
            ans = sum(1 for row in rows if arg in row)
        else:
            q, ans = "What is the sum of the numbers in " + path + " (one integer per line)?", sum(int(x) for x in rows)
        files[P["inbox"] + "/" + tid + ".txt"] = "Ticket " + tid + "\\n" + r.choice(P["openers"]) + "\\n\\n" + q + "\\n"
        tickets.append({"id": tid, "kind": kind, "path": path, "arg": arg, "answer": str(ans)})
    return {"files": files, "facts": {"tickets": tickets}}
'''


def _count(rng: random.Random) -> int:
    tier = rng.random()
    if tier < 0.4:
        return rng.randint(5, 20)
    if tier < 0.75:
        return rng.randint(20, 60)
    return rng.randint(60, 160)


def _answer_cmd(t: dict, dest: str) -> str:
    p = q(t["path"])
    return {"words": f"wc -w < {p} > {dest}", "bytes": f"wc -c < {p} > {dest}",
            "sha256": f"sha256sum {p} | cut -d' ' -f1 > {dest}", "line": f"sed -n '{t['arg']}p' {p} > {dest}",
            "grep": f"grep -c {q(t['arg'])} {p} > {dest}",
            "sum": f"awk '{{s += $1}} END {{print s + 0}}' {p} > {dest}"}[t["kind"]]


@family("batch-tickets", TRAIN, "long-horizon", "answer N support tickets, each a separate question about a file")
def batch_tickets(rng: random.Random) -> TaskDraft:
    n = _count(rng)
    inbox, data, out = (pick(rng, ["inbox", "tickets", "queue"]), pick(rng, ["files", "data", "docs"]),
                        pick(rng, ["/app/answers", "/app/replies", "/app/resolved"]))
    params = {"seed": rng.getrandbits(48), "n": n, "nfiles": max(3, n // 2 + rng.randint(0, 5)), "files": data,
              "inbox": inbox, "prefix": pick(rng, ["T", "REQ", "TCK", "SUP"]),
              "openers": ["Hi team, quick question:", "Customer asks:", "Please help with this one.",
                          "Urgent!", "Low priority.", "Forwarded from the on-call channel."]}
    plan, gen_files, steps = build_time_tree(_TICKET_CODE, params)
    tickets = sorted(plan["facts"]["tickets"], key=lambda t: t["id"])
    intro = pick(rng, [
        f"There are {n} support tickets in `/app/{inbox}/`, one file per ticket (`<ticket-id>.txt`). Each asks "
        f"one question about a file under `/app/{data}/`.",
        f"{say(rng, 'task')} is to work through the ticket queue in `/app/{inbox}/` ({n} tickets). Every ticket "
        f"is a question about one of the files in `/app/{data}/`.",
        f"The helpdesk left {n} unanswered tickets in `/app/{inbox}/`; each needs a fact about a file in "
        f"`/app/{data}/`.",
    ])
    items = [f"For {say(rng, 'each')} ticket, {say(rng, 'write').lower()} the answer alone (a number, a digest or "
             f"a line of text; no labels) to `{out}/<ticket-id>.txt`, where `<ticket-id>` is the ticket's file "
             "name without `.txt`.",
             f"Do not create answer files for tickets that do not exist, and leave `/app/{inbox}` and "
             f"`/app/{data}` unchanged."]
    instruction = compose(rng, intro, items)
    k = min(4, max(1, n // 5))
    # Contiguous groups in ticket order, so an agent working through the queue in order earns partial credit.
    groups = [tickets[i * len(tickets) // k:(i + 1) * len(tickets) // k] for i in range(k)]
    prelude = (f"OUT = {out!r}\nINBOX = '/app/{inbox}'\n\n\n"
               "def check(expected):\n"
               "    for tid, ans in expected.items():\n"
               "        p = pathlib.Path(OUT) / (tid + '.txt')\n"
               "        assert p.is_file(), f'no answer for {tid}'\n"
               "        assert p.read_text().strip() == ans.strip(), tid\n")
    tests = [f"def test_tickets_group_{i + 1}():\n    check({literal({t['id']: t['answer'] for t in g})})\n"
             for i, g in enumerate(groups)]
    tests.append("def test_no_extra_answers():\n"
                 f"    assert sorted(os.listdir(OUT)) == {literal(sorted(t['id'] + '.txt' for t in tickets))}\n"
                 f"    assert len(os.listdir(INBOX)) == {n}\n")
    if len(tests) < 3:
        tests.append("def test_first_ticket():\n"
                     f"    check({literal({tickets[0]['id']: tickets[0]['answer']})})\n")
    sol = [f"ls /app/{inbox} | head; ls /app/{inbox} | wc -l", f"mkdir -p {out}"]
    for t in tickets:
        sol.append(f"cat /app/{inbox}/{t['id']}.txt")
        sol.append(_answer_cmd(t, f"{out}/{t['id']}.txt"))
    sol.append(f"ls {out} | wc -l")
    return TaskDraft(instruction=instruction, tests=tests, solution=sol, files=gen_files, build_steps=steps,
                     test_prelude=prelude, difficulty="hard" if n > 60 else "medium", agent_timeout_sec=3600.0,
                     tags=("long-horizon", "batch"))


# ----------------------------------------------------------------------------------------------- manifest-audit

_AUDIT_CODE = '''
def plan(P):
    r = Rand(P["seed"])
    files, facts = {}, {}
    releases = sorted(set(P["product"] + "-" + str(r.randint(0, 9)) + "." + str(r.randint(0, 30)) + "." +
                          str(r.randint(0, 9)) for _ in range(P["k"])))
    for rel in releases:
        names = sorted(set(r.word(r.randint(3, 8)) + r.choice([".bin", ".so", ".txt", ".conf", ".py"])
                           for _ in range(r.randint(3, 8))))
        content = {n: "".join(r.word(60) + "\\n" for _ in range(r.randint(1, 6))) for n in names}
        sums = "".join(hashlib.sha256(content[n].encode()).hexdigest() + "  " + n + "\\n" for n in names)
        bad = []
        roll = r.randint(0, 9)
        if roll < P["bad_rate"]:
            for n in names:
                if r.randint(0, 3) == 0:
                    bad.append(n)
            if not bad:
                bad.append(r.choice(names))
            for n in bad:
                if r.randint(0, 2) == 0:
                    del content[n]
                else:
                    content[n] = content[n][:-5] + "XXXX\\n"
        for n, c in content.items():
            files[P["root"] + "/" + rel + "/" + n] = c
        files[P["root"] + "/" + rel + "/" + P["manifest"]] = sums
        facts[rel] = sorted(bad)
    return {"files": files, "facts": facts}
'''


@family("manifest-audit", HELDOUT, "long-horizon", "verify K releases against checksum manifests, quarantine bad ones")
def manifest_audit(rng: random.Random) -> TaskDraft:
    k = _count(rng) // 2 + 3
    root_name = pick(rng, ["releases", "dist", "artifacts"])
    manifest = pick(rng, ["SHA256SUMS", "checksums.sha256", "MANIFEST.sha256"])
    product = pick(rng, ["agent", "server", "cli", "engine", "relay"])
    for _attempt in range(50):  # the generator's draw must leave both good and bad releases
        params = {"seed": rng.getrandbits(48), "k": k, "root": root_name, "manifest": manifest,
                  "product": product, "bad_rate": rng.randint(2, 5)}
        plan, gen_files, steps = build_time_tree(_AUDIT_CODE, params)
        facts: dict[str, list[str]] = plan["facts"]
        if any(facts.values()) and not all(facts.values()):
            break
    else:
        raise AssertionError("manifest-audit: no seed gave both good and bad releases")
    root, report, quarantine = f"/app/{root_name}", pick(rng, ["/app/audit.txt", "/app/verify-report.txt"]), \
        pick(rng, ["/app/quarantine", "/app/rejected"])
    lines_ = [f"{r} OK" if not bad else f"{r} BAD {','.join(bad)}" for r, bad in sorted(facts.items())]
    intro = pick(rng, [
        f"`{root}` holds {len(facts)} release folders, each with a `{manifest}` file in `sha256sum` format. Some "
        "releases have corrupted or missing files.",
        f"{say(rng, 'task')} is to audit the release folders under `{root}` against their `{manifest}` checksum "
        "manifests.",
    ])
    items = [f"{say(rng, 'write')} `{report}` with one line per release, sorted by release name: `<release> OK` if "
             "every file listed in its manifest exists and matches, otherwise `<release> BAD <files>` where "
             "`<files>` is the comma-separated, sorted list of listed files that are missing or do not match.",
             f"{say(rng, 'then')} move every BAD release folder (whole) into `{quarantine}/`, keeping its name; OK "
             f"releases stay in `{root}` untouched."]
    bad_rel = sorted(r for r, b in facts.items() if b)
    ok_rel = sorted(r for r, b in facts.items() if not b)
    g = min(3, max(1, len(lines_) // 4))
    chunks = [lines_[i * len(lines_) // g:(i + 1) * len(lines_) // g] for i in range(g)]
    tests = [f"def test_report_part_{i + 1}():\n    assert set({literal(sorted(c))}) <= set(lines({report!r}))\n"
             for i, c in enumerate(chunks)]
    tests.append(f"def test_report_exact():\n    assert lines({report!r}) == {literal(lines_)}\n")
    tests.append(f"def test_quarantine():\n    assert sorted(os.listdir({quarantine!r})) == {literal(bad_rel)}\n"
                 f"    assert not any(os.path.exists(os.path.join({root!r}, r)) for r in {literal(bad_rel)})\n")
    tests.append(f"def test_ok_releases_in_place():\n    for r in {literal(ok_rel)}:\n"
                 f"        assert os.path.isfile(os.path.join({root!r}, r, {manifest!r}))\n"
                 f"    assert os.path.isdir({quarantine!r})\n")
    sol = [f"ls {root}", f"head -3 {root}/{sorted(facts)[0]}/{manifest}"]
    for r in sorted(facts):
        sol.append(f"cd {root}/{r} && sha256sum -c {manifest}; cd /app")
    sol.append(heredoc(report, "\n".join(lines_)))
    sol.append(f"mkdir -p {quarantine}")
    for r in bad_rel:
        sol.append(f"mv {root}/{r} {quarantine}/")
    sol.append(f"cat {report}; ls {quarantine}")
    return TaskDraft(instruction=compose(rng, intro, items), tests=tests, solution=sol, files=gen_files,
                     build_steps=steps, difficulty="hard" if k > 40 else "medium", agent_timeout_sec=3600.0,
                     tags=("long-horizon", "sha256"))
