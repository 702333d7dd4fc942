"""Search-and-discover families: the facts the task needs exist only inside the built image.

The trees are produced at build time by a seeded generator (`build_time_tree`), so the agent has to look
(find, grep, stat, run a program) and read what comes back; nothing in the instruction gives the answer away.
`chain-follow` is also long-horizon: each hop's file names the next one, so the reference solution is one
command per hop, each depending on the previous output.
"""

from __future__ import annotations

import random

from conch.tasks.synth.base import (
    TRAIN,
    TaskDraft,
    build_time_tree,
    compose,
    family,
    literal,
    pick,
    printf_lines,
    q,
    say,
)

_VAULT_CODE = '''
WORDS = ["alpha", "bravo", "delta", "echo", "foxtrot", "golf", "hotel", "india", "kilo", "lima", "mike",
         "oscar", "papa", "romeo", "sierra", "tango", "victor", "zulu"]


def plan(P):
    r = Rand(P["seed"])
    dirs = [""]
    for _ in range(P["ndirs"]):
        parent = r.choice(dirs)
        if parent.count("/") + 1 >= P["depth"]:
            parent = ""
        dirs.append((parent + "/" if parent else "") + r.choice(WORDS) + "-" + str(r.randint(0, 99)))
    dirs = sorted(set(dirs))
    files = {}
    while len(files) < P["nfiles"]:
        d = r.choice(dirs)
        rel = P["root"] + "/" + (d + "/" if d else "") + r.word(r.randint(4, 8)) + r.choice(P["exts"])
        if rel in files:
            continue
        rows = [" ".join(r.word(r.randint(3, 8)) for _ in range(r.randint(2, 9))) for _ in range(r.randint(1, 14))]
        files[rel] = "\\n".join(rows) + "\\n"
    names = sorted(files)
    facts = {}
    deepest = max(n.count("/") for n in names)
    holder = r.choice([n for n in names if n.count("/") == deepest])
    code = r.word(12, "ABCDEFGHJKLMNPQRSTUVWXYZ23456789")
    files[holder] += P["key"] + "=" + code + "\\n"
    for n in [r.choice(names) for _ in range(4)]:
        if n != holder:
            files[n] += "# " + P["key"] + "=" + r.word(12, "ABCDEFGHJKLMNPQRSTUVWXYZ23456789") + " (revoked)\\n"
            files[n] += P["key"] + "_OLD=" + r.word(12, "ABCDEFGHJKLMNPQRSTUVWXYZ23456789") + "\\n"
    facts["code"] = code
    big = r.choice(names)
    files[big] += ("".join(r.word(70) + "\\n" for _ in range(40)))
    facts["largest"] = big[len(P["root"]) + 1:]
    facts["count_ext"] = sum(1 for n in names if n.endswith(P["count_ext"]))
    exe = r.choice([n for n in names if n != big])
    facts["executable"] = exe[len(P["root"]) + 1:]
    modes = {n: 0o644 for n in names}
    modes[exe] = 0o755
    base = 1600000000 + r.randint(0, 10 ** 7)
    stamps = list(range(len(names)))
    r.shuffle(stamps)
    mtimes = {n: base + 3600 * s for n, s in zip(names, stamps)}
    facts["newest"] = max(names, key=lambda n: mtimes[n])[len(P["root"]) + 1:]
    facts["log_lines"] = sum(files[n].count("\\n") for n in names if n.endswith(".log"))
    serial = r.word(4, "0123456789") + "-" + r.word(6, "ABCDEFGHJKLMNPQRSTUVWXYZ")
    facts["serial"] = serial
    files["bin/" + P["probe"]] = (
        "#!/usr/bin/env python3\\nimport sys\\n"
        "if len(sys.argv) > 1 and sys.argv[1] in ('-h', '--help'):\\n"
        "    print('usage: " + P["probe"] + " [--verbose]   report the hardware identity of this host')\\n"
        "    sys.exit(0)\\n"
        "print('probe ok')\\n"
        "if '--verbose' in sys.argv:\\n"
        "    print('serial: " + serial + "')\\n"
        "else:\\n"
        "    print('(run with --verbose for the full identity)')\\n")
    modes["bin/" + P["probe"]] = 0o755
    return {"files": files, "modes": modes, "mtimes": mtimes, "facts": facts}
'''

_QUESTIONS = {
    "code": "the value assigned to `{key}` on the one line of the form `{key}=<value>` somewhere under `{root}` "
            "(commented lines and other keys such as `{key}_OLD` do not count)",
    "largest": "the path (relative to `{root}`) of the largest file under `{root}`",
    "count_ext": "how many files under `{root}` (at any depth) end in `{ext}`",
    "executable": "the path (relative to `{root}`) of the only regular file under `{root}` that is executable",
    "newest": "the path (relative to `{root}`) of the most recently modified file under `{root}`",
    "log_lines": "the total number of lines in all `.log` files under `{root}`",
    "serial": "the serial number that `/app/bin/{probe}` reports about this host",
}


@family("discover-value", TRAIN, "search-and-discover", "find facts hidden in a build-time generated tree")
def discover_value(rng: random.Random) -> TaskDraft:
    root_name = pick(rng, ["vault", "archive", "warehouse", "dataroom", "srv/share"])
    root = f"/app/{root_name}"
    params = {"seed": rng.getrandbits(48), "root": root_name, "ndirs": rng.randint(6, 30), "depth": rng.randint(3, 6),
              "nfiles": rng.randint(40, 250), "exts": [".txt", ".log", ".cfg", ".dat", ".md"],
              "key": pick(rng, ["ACCESS_CODE", "DEPLOY_TOKEN", "VAULT_KEY", "UNLOCK_PIN"]),
              "count_ext": pick(rng, [".cfg", ".md", ".dat"]), "probe": pick(rng, ["hwprobe", "ident", "sysinfo"])}
    plan, gen_files, steps = build_time_tree(_VAULT_CODE, params)
    facts = plan["facts"]
    keys = rng.sample(sorted(_QUESTIONS), rng.randint(3, 6))
    answers = pick(rng, ["/app/answers.txt", "/app/findings.txt", "/app/result.txt"])
    fmt = dict(key=params["key"], root=root, ext=params["count_ext"], probe=params["probe"])
    items = [f"`{k}`: " + _QUESTIONS[k].format(**fmt) for k in keys]
    intro = pick(rng, [
        f"Investigate the directory tree `{root}` on this machine and report what you find. {say(rng, 'write')} "
        f"the answers to `{answers}`, one `name=value` line per item:",
        f"{say(rng, 'task')} is a scavenger hunt. Everything you need is on this machine (mostly under `{root}`). "
        f"Answer each item below as a `name=value` line in `{answers}`:",
        f"Find the following facts and record them in `{answers}` as lines `name=value` (names as given):",
    ])
    instruction = compose(rng, intro, items, outro="Write values without quotes or extra spaces; order the "
                                                   "lines as you like.")
    prelude = (f"ANSWERS = {answers!r}\n\n\n"
               "def answer(name):\n"
               "    for ln in lines(ANSWERS):\n"
               "        k, sep, v = ln.partition('=')\n"
               "        if sep and k.strip() == name:\n"
               "            return v.strip()\n"
               "    raise AssertionError(f'no line for {name}')\n")
    tests = [f"def test_{k}():\n    assert answer({k!r}) == {str(facts[k])!r}\n" for k in keys]
    cmds = {"code": f"grep -rn '^{params['key']}=' {root}",
            "largest": f"find {root} -type f -printf '%s %P\\n' | sort -n | tail -3",
            "count_ext": f"find {root} -type f -name '*{params['count_ext']}' | wc -l",
            "executable": f"find {root} -type f -perm -u+x -printf '%P\\n'",
            "newest": f"find {root} -type f -printf '%T@ %P\\n' | sort -n | tail -3",
            "log_lines": f"find {root} -type f -name '*.log' -exec cat {{}} + | wc -l",
            "serial": f"/app/bin/{params['probe']} --help; /app/bin/{params['probe']} --verbose"}
    sol = [f"find {root} -type f | head -20", f"find {root} -type f | wc -l"] + [cmds[k] for k in keys]
    sol.append(printf_lines(answers, [f"{k}={facts[k]}" for k in keys]))
    sol.append(f"cat {answers}")
    return TaskDraft(instruction=instruction, tests=tests, solution=sol, files=gen_files, build_steps=steps,
                     test_prelude=prelude, difficulty="medium", tags=("find", "grep"))


# ----------------------------------------------------------------------------------------------- chain-follow

_CHAIN_CODE = '''
def plan(P):
    r = Rand(P["seed"])
    used = set()

    def fresh():
        while True:
            sub = (r.choice(P["subdirs"]) + "/") if P["subdirs"] else ""
            name = sub + r.word(P["namelen"], "abcdefghijkmnpqrstuvwxyz23456789") + P["ext"]
            if name not in used:
                used.add(name)
                return name

    def token():
        return r.word(4, "ABCDEFGHJKLMNPQRSTUVWXYZ") + "-" + r.word(6, "0123456789")

    def noise():
        return " ".join(r.word(r.randint(3, 7)) for _ in range(r.randint(3, 8)))

    chain = [fresh() for _ in range(P["length"])]
    decoys = [fresh() for _ in range(P["decoys"])]
    files = {}
    secret = token()
    groups, i = [], 0
    while i < len(decoys):
        k = r.randint(2, 6)
        groups.append(decoys[i:i + k])
        i += k
    for seq, final in [(chain, secret)] + [(g, token()) for g in groups]:
        for j, name in enumerate(seq):
            rows = [noise()]
            if r.randint(0, 3) == 0:
                rows.append("# stale link: " + r.choice(decoys or chain))
            if j + 1 < len(seq):
                rows.append(P["fmt"].replace("NAME", seq[j + 1]))
            else:
                rows.append(P["end"])
                rows.append("secret: " + final)
            if r.randint(0, 1):
                rows.append(noise())
            files[P["root"] + "/" + name] = "\\n".join(rows) + "\\n"
    return {"files": files, "facts": {"chain": chain, "secret": secret}}
'''


def _chain_length(rng: random.Random) -> int:
    tier = rng.random()
    if tier < 0.45:
        return rng.randint(8, 40)
    if tier < 0.8:
        return rng.randint(40, 120)
    return rng.randint(120, 320)


@family("chain-follow", TRAIN, "long-horizon", "follow a chain of files, each naming the next, to a secret")
def chain_follow(rng: random.Random) -> TaskDraft:
    root_name = pick(rng, ["maze", "trail", "clues", "hunt", "breadcrumbs"])
    root = f"/app/{root_name}"
    length = _chain_length(rng)
    fmt, fdesc = pick(rng, [("next: NAME", "a line `next: <path>`"), ("-> NAME", "a line `-> <path>`"),
                            ("continue at NAME", "a line `continue at <path>`"),
                            ('{"next": "NAME"}', 'a JSON line `{"next": "<path>"}`')])
    subdirs = pick(rng, [[], [], ["a", "b", "c"], ["north", "south", "east", "west"]])
    params = {"seed": rng.getrandbits(48), "root": root_name, "length": length,
              "decoys": rng.randint(length // 3, length // 2 + 10), "namelen": rng.randint(5, 8),
              "ext": pick(rng, [".txt", ".clue", ".note", ""]), "subdirs": subdirs, "fmt": fmt,
              "end": pick(rng, ["END", "THE END", "== end of trail =="])}
    plan, gen_files, steps = build_time_tree(_CHAIN_CODE, params)
    chain, secret = plan["facts"]["chain"], plan["facts"]["secret"]
    answer = pick(rng, ["/app/answer.txt", "/app/secret.txt", "/app/solution.txt"])
    path_file = pick(rng, ["/app/path.txt", "/app/route.txt", "/app/visited.txt"])
    example = f", e.g. `{subdirs[-1]}/{'x' * params['namelen']}{params['ext']}`" if subdirs else ""
    where = f"(a path relative to `{root}`{example})"
    intro = pick(rng, [
        f"`{root}` holds a trail of files. Start at `{root}/{chain[0]}`. Each file on the trail names the next "
        f"one with {fdesc} {where}; the last file says `{params['end']}` and holds a line `secret: <value>`.",
        f"{say(rng, 'task')} is to follow a chain of clues. The first clue is `{root}/{chain[0]}`; every clue "
        f"points to the next through {fdesc} {where}. The final clue contains `{params['end']}` and a "
        "`secret: <value>` line.",
        f"Follow the breadcrumbs under `{root}`, beginning with `{chain[0]}`. A file continues the trail with "
        f"{fdesc} {where}; the trail ends at the file that reads `{params['end']}`, which carries a "
        "`secret: <value>` line.",
    ])
    items = [f"{say(rng, 'write')} the secret value (just the value) to `{answer}`.",
             f"{say(rng, 'write')} the trail to `{path_file}`: the paths of the files you visited in order, relative "
             f"to `{root}`, one per line, from the start file to the final file inclusive.",
             "Other files in the folder form false trails with their own secrets, and lines starting with `#` "
             "are comments, not links: only follow the real links from the start file."]
    instruction = compose(rng, intro + " Then:", items)
    half = max(2, len(chain) // 2)
    prelude = f"CHAIN = {literal(chain)}\nPATH = {path_file!r}\n"
    tests = [f"def test_secret():\n    assert read({answer!r}).strip() == {secret!r}\n",
             "def test_trail_start():\n    assert [l.strip() for l in lines(PATH)][:3] == CHAIN[:3]\n",
             f"def test_trail_first_half():\n    assert [l.strip() for l in lines(PATH)][:{half}] == CHAIN[:{half}]\n",
             "def test_trail_complete():\n    assert [l.strip() for l in lines(PATH) if l.strip()] == CHAIN\n"]
    sol = [f"ls {root} | head -20", f"ls -R {root} | wc -l"] + [f"cat {q(root + '/' + n)}" for n in chain]
    sol.append(printf_lines(path_file, chain))
    sol.append(f"echo {q(secret)} > {answer}")
    sol.append(f"wc -l {path_file}; cat {answer}")
    return TaskDraft(instruction=instruction, tests=tests, solution=sol, files=gen_files, build_steps=steps,
                     test_prelude=prelude, difficulty="hard" if length > 100 else "medium",
                     agent_timeout_sec=3600.0, tags=("long-horizon", f"hops-{length // 50 * 50}+"))
