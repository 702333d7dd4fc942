"""The git family: answer questions about, and repair, a repository whose history is built at image build time.

This is the one family that needs a package outside the base root: its Dockerfile installs git with apt,
which needs network at build time (the local sandbox allows it for RUN; the built image is cached). The
history is written by a generated shell script with fixed author/committer dates, so it is identical per seed.
"""

from __future__ import annotations

import random

from conch.tasks.synth.base import (
    HELDOUT,
    TaskDraft,
    compose,
    family,
    heredoc,
    pick,
    q,
    say,
    words,
)

APT_GIT = "RUN apt-get update && apt-get install -y --no-install-recommends git && rm -rf /var/lib/apt/lists/*"


def _commit(script: list[str], n: int, author: str, message: str) -> None:
    date = f"2024-01-{1 + n // 4:02d}T{9 + n % 4 * 2:02d}:00:00+0000"
    email = f"{author}@example.com"
    script.append(f"git add -A && GIT_AUTHOR_NAME={author} GIT_AUTHOR_EMAIL={email} GIT_AUTHOR_DATE={date} "
                  f"GIT_COMMITTER_NAME={author} GIT_COMMITTER_EMAIL={email} GIT_COMMITTER_DATE={date} "
                  f"git commit -q -m {q(message)}")


@family("git-history", HELDOUT, "version-control", "dig through a git history, tag, restore and revert")
def git_history(rng: random.Random) -> TaskDraft:
    proj = pick(rng, words(rng, "project", 5))
    repo = f"/app/{proj}"
    authors = words(rng, "name", rng.randint(2, 4))
    flag = f"{pick(rng, ['enable', 'use', 'allow'])}_{pick(rng, words(rng, 'animal', 4))}"
    version = f"{rng.randint(1, 4)}.{rng.randint(0, 9)}.0"
    timeout = rng.randint(20, 90)
    plan_text = "".join(f"- {pick(rng, ['ship', 'test', 'document', 'refactor'])} the {w} module\n"
                        for w in words(rng, "component", rng.randint(3, 6)))
    app = ["import os", "", f"TIMEOUT = {timeout}", "", "", "def handler(event):",
           "    return {'ok': True, 'event': event}", "", "", "# helpers", "", "",
           "def version():", "    return open('VERSION').read().strip()", ""]
    s = ["set -e", f"mkdir -p {repo} && cd {repo}", "git init -q -b main .",
         "git config user.name 'Ops Bot' && git config user.email ops@example.com"]
    state = {"README.md": f"# {proj}\n", "VERSION": "0.1.0\n", "config/settings.ini": "[core]\nname = " + proj + "\n",
             "src/app.py": "\n".join(app) + "\n", "notes/plan.md": plan_text}
    log: list[tuple[str, str]] = []  # (author, message)

    def snap(msg: str) -> None:
        for path, text in state.items():
            s.append(heredoc(path, text).replace("cat > ", f"mkdir -p $(dirname {q(path)}) && cat > ", 1))
        author = pick(rng, authors)
        _commit(s, len(log), author, msg)
        log.append((author, msg))

    snap("Initial import")
    events = ["flag", "bump", "delete", "bug"]
    rng.shuffle(events)
    filler = [f"Tweak {w} wording" for w in words(rng, "color", 6)]
    for ev in events:
        for _ in range(rng.randint(1, 3)):
            msg = filler.pop() if filler else "Minor edits"
            state["README.md"] += f"{pick(rng, ['Note', 'Tip', 'See also'])}: {pick(rng, words(rng, 'fruit', 5))}\n"
            snap(msg)
        if ev == "flag":
            state["config/settings.ini"] += f"{flag} = true\n"
            flag_msg = f"{pick(rng, ['Add', 'Introduce', 'Turn on'])} the {flag.split('_', 1)[1]} option"
            snap(flag_msg)
        elif ev == "bump":
            state["VERSION"] = version + "\n"
            snap(f"Bump version to {version}")
        elif ev == "delete":
            del state["notes/plan.md"]
            s.append(f"git rm -q notes/plan.md")
            snap(f"Remove {pick(rng, ['obsolete', 'old', 'stale'])} planning notes")
        else:
            state["src/app.py"] = state["src/app.py"].replace(f"TIMEOUT = {timeout}", "TIMEOUT = 3")
            bug_msg = f"{pick(rng, ['Speed up', 'Tune', 'Shorten'])} request handling"
            snap(bug_msg)
    counts = {a: sum(1 for au, _m in log if au == a) for a in authors}
    who = pick(rng, authors)
    answers = pick(rng, ["/app/answers", "/app/findings"])
    reqs = rng.sample(["flag", "tag", "restore", "revert", "count"], rng.randint(3, 5))
    items, tests = [], []
    sol = [f"cd {repo} && git log --oneline | head -40", "git status --short"]
    git = f"subprocess.run(['git', '-C', {repo!r}, *args], capture_output=True, text=True, check=True).stdout"
    prelude = f"def git(*args):\n    return {git}\n"
    for r in reqs:
        if r == "flag":
            items.append(f"{say(rng, 'write')} the subject line of the commit that introduced the `{flag}` setting "
                         f"in `config/settings.ini` to `{answers}/flag-commit.txt`.")
            tests.append(f"def test_flag_commit():\n    assert read({answers + '/flag-commit.txt'!r}).strip() == {flag_msg!r}\n")
            sol += [f"git log -S{q(flag)} --format=%s -- config/settings.ini",
                    f"mkdir -p {answers} && git log -S{q(flag)} --format=%s -- config/settings.ini > "
                    f"{answers}/flag-commit.txt"]
        elif r == "tag":
            items.append(f"Create a tag `v{version}` on the commit that bumped the version to {version}.")
            tests.append(f"def test_tag():\n    want = git('log', '--format=%H', '--grep', '^Bump version to {version}$', 'main')\n"
                         f"    assert git('rev-parse', 'v{version}^{{commit}}').strip() == want.strip()\n")
            sol.append(f"git tag v{version} $(git log --format=%H --grep='^Bump version to {version}$')")
        elif r == "restore":
            items.append("The file `notes/plan.md` was deleted in some commit. Bring back its last version and "
                         "commit it (as a new commit on `main`).")
            tests.append(f"def test_plan_restored():\n    assert git('show', 'HEAD:notes/plan.md') == {plan_text!r}\n")
            sol += ["git log --diff-filter=D --format='%h %s' -- notes/plan.md",
                    "git checkout \"$(git log --diff-filter=D --format=%H -- notes/plan.md)^\" -- notes/plan.md",
                    "git commit -q -m 'Restore planning notes' && git log --oneline -1"]
        elif r == "revert":
            items.append(f"The commit \"{bug_msg}\" broke request handling. Undo its change with a new commit "
                         "(do not rewrite history: every existing commit must stay in `main`'s history).")
            tests.append(f"def test_bug_reverted():\n    assert 'TIMEOUT = {timeout}' in git('show', 'HEAD:src/app.py')\n"
                         f"    bad = git('log', '--format=%H', '--grep', {('^' + bug_msg + '$')!r}, 'main').strip()\n"
                         "    assert bad\n")
            sol.append(f"git revert --no-edit $(git log --format=%H --grep={q('^' + bug_msg + '$')})")
        else:
            items.append(f"{say(rng, 'write')} the number of commits authored by `{who}` (before your own changes) "
                         f"to `{answers}/{who}-commits.txt`.")
            tests.append(f"def test_author_count():\n    assert read({answers + '/' + who + '-commits.txt'!r}).strip() == "
                         f"{str(counts[who])!r}\n")
            sol.append(f"mkdir -p {answers} && git log --author={q(who)} --format=%h | wc -l > {answers}/{who}-commits.txt")
    tests.append(f"def test_history_kept():\n    subjects = git('log', '--format=%s', 'main').splitlines()\n"
                 f"    assert {[m for _a, m in log]!r} == [s for s in reversed(subjects) if s in {[m for _a, m in log]!r}]\n"
                 f"    assert git('status', '--porcelain').strip() == ''\n"
                 f"    assert len(subjects) > {len(log)} or {('restore' not in reqs and 'revert' not in reqs)!r}\n")
    sol.append("git log --oneline | head -5; git status --short; cd /app")
    intro = pick(rng, [
        f"`{repo}` is a git repository (branch `main`). Do the following there:",
        f"{say(rng, 'task')} is some repository archaeology in `{repo}` (a git repo on branch `main`):",
        f"Work in the git repository `{repo}`:",
    ])
    return TaskDraft(instruction=compose(rng, intro, items, outro="Leave the working tree clean (everything "
                                                                   "committed)."),
                     tests=tests, solution=sol, files={".gen/make_repo.sh": "\n".join(s) + "\n"},
                     base_steps=[APT_GIT], build_steps=["RUN bash /app/.gen/make_repo.sh && rm -rf /app/.gen"],
                     test_prelude=prelude, difficulty="medium", tags=("git",))
