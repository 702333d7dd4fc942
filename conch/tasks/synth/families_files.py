"""Families about files themselves: organizing a folder, archives and compression, permissions, tree sync.

Every environment file is generated on the host and shipped with COPY; what must not be shipped as-is
(archives, compressed logs, wrong permission bits) is produced by RUN steps at build time so the task folder
stays plain text and byte-identical per seed.
"""

from __future__ import annotations

import random

from conch.tasks.synth.base import (
    HELDOUT,
    TRAIN,
    TaskDraft,
    compose,
    family,
    hexid,
    literal,
    pick,
    printf_lines,
    q,
    say,
    sha256_text,
    words,
)


def _text_blob(rng: random.Random, size: int) -> str:
    """Deterministic printable text of exactly `size` bytes."""
    vocab = ["alpha", "beta", "gamma", "delta", "omega", "sigma", "kappa", "lambda", "zeta", "theta", "rho"]
    out: list[str] = []
    n = 0
    while n < size:
        w = pick(rng, vocab) + (" " if rng.random() < 0.85 else "\n")
        out.append(w)
        n += len(w)
    s = "".join(out)[:size]
    return s[:-1] + "\n" if size > 1 else s


# ----------------------------------------------------------------------------------------------- files-organize


@family("files-organize", TRAIN, "file-operations", "sort a flat folder of files into a layout by a rule")
def files_organize(rng: random.Random) -> TaskDraft:
    mode = pick(rng, ["ext", "date", "size"])
    src = pick(rng, ["/app/incoming", "/app/inbox", "/app/dump", "/app/unsorted", "/app/drop"])
    dst = pick(rng, ["/app/sorted", "/app/organized", "/app/library", "/app/filed"])
    drop_empty = rng.random() < 0.6
    manifest = pick(rng, [None, "MANIFEST.txt", "index.txt", "contents.lst"])
    n = rng.randint(12, 36)
    stems = words(rng, "fruit", 10) + words(rng, "animal", 10) + words(rng, "city", 10)
    threshold = pick(rng, [512, 1000, 1024, 2048])
    exts = rng.sample(["txt", "csv", "log", "json", "md", "yaml", "conf", "py", "sh", "xml", "ini"], rng.randint(3, 5))
    upper = rng.random() < 0.5
    files: dict[str, str] = {}  # name -> content
    target: dict[str, str] = {}  # name -> relative destination folder
    empties: list[str] = []
    used: set[str] = set()
    for i in range(n):
        stem = f"{pick(rng, stems)}-{pick(rng, stems)}-{i:02d}"
        if rng.random() < 0.2:
            stem = stem.replace("-", " ", 1)
        if mode == "ext":
            ext = pick(rng, exts)
            shown = ext.upper() if upper and rng.random() < 0.25 else ext
            name, folder = f"{stem}.{shown}", ext
        elif mode == "date":
            y, m, d = rng.choice([2021, 2022, 2023, 2024]), rng.randint(1, 12), rng.randint(1, 28)
            name, folder = f"{y}-{m:02d}-{d:02d}_{stem}.{pick(rng, exts)}", f"{y}/{m:02d}"
        else:
            name, folder = f"{stem}.{pick(rng, exts)}", ""
        if name in used:
            continue
        used.add(name)
        size = rng.randint(1, 3 * threshold)
        if size == threshold:
            size += 1
        content = _text_blob(rng, size)
        if mode == "size":
            folder = "small" if size < threshold else "large"
        files[name] = content
        target[name] = folder
    if drop_empty:
        for k in range(rng.randint(1, 4)):
            name = f"empty-{pick(rng, stems)}-{k}.{pick(rng, exts)}"
            files[name] = ""
            empties.append(name)
    if not drop_empty and mode == "size":
        pass
    expected = {f"{target[nm]}/{nm}": sha256_text(c) for nm, c in files.items() if nm not in empties}

    if mode == "ext":
        rule = (f"Move {say(rng, 'each')} file into `{dst}/<ext>/`, where `<ext>` is the file's extension in lower "
                "case without the dot" + (" (extensions in the source may be upper case, e.g. `.TXT` goes to "
                f"`{dst}/txt/`)" if upper else "") + ". Keep the file names unchanged.")
    elif mode == "date":
        rule = (f"{say(rng, 'each').capitalize()} file name starts with a date `YYYY-MM-DD_`. Move each file into "
                f"`{dst}/YYYY/MM/` using the year and month of that date, keeping its name.")
    else:
        rule = (f"Move files smaller than {threshold} bytes into `{dst}/small/` and all other files into "
                f"`{dst}/large/`, keeping their names.")
    items = [rule, f"When you are done, `{src}` must contain no files."]
    if drop_empty:
        items.append("Empty (zero-byte) files are junk: delete them instead of moving them" +
                     (" (they count as neither small nor large)." if mode == "size" else "."))
    if manifest:
        items.append(f"{say(rng, 'create')} `{dst}/{manifest}` listing every file under `{dst}` (except the "
                     f"listing itself) as a path relative to `{dst}`, one per line, sorted in byte order "
                     "(`LC_ALL=C sort`).")
    items.append("Some names contain spaces; file contents must not change.")
    intro = pick(rng, [
        f"The folder `{src}` has become a dumping ground of {len(files)} files. Reorganize it:",
        f"{say(rng, 'task')} is to tidy up `{src}`, which holds a flat pile of files, by moving them under `{dst}`:",
        f"A flat directory `{src}` needs to be sorted into a folder hierarchy rooted at `{dst}`. Rules:",
    ])
    instruction = compose(rng, intro, items)

    groups = sorted({f for f in target.values()})
    rng.shuffle(groups)
    k = min(3, len(groups))
    chunks = [groups[i::k] for i in range(k)]
    prelude = (f"SRC = {src!r}\nDST = {dst!r}\nEXPECTED = {literal(expected)}\n"
               f"EMPTIES = {literal(empties)}\nMANIFEST = {manifest!r}\n\n\n"
               "def files_under(root):\n"
               "    out = set()\n"
               "    for dirpath, _dirs, names in os.walk(root):\n"
               "        for nm in names:\n"
               "            out.add(os.path.relpath(os.path.join(dirpath, nm), root))\n"
               "    return out\n\n\n"
               "def check_folders(folders):\n"
               "    wanted = {p: h for p, h in EXPECTED.items() if p.rsplit('/', 1)[0] in folders}\n"
               "    assert wanted\n"
               "    for rel, digest in wanted.items():\n"
               "        path = pathlib.Path(DST) / rel\n"
               "        assert path.is_file(), f'missing {path}'\n"
               "        assert hashlib.sha256(path.read_bytes()).hexdigest() == digest, f'content changed: {path}'\n")
    tests = [
        "def test_source_has_no_files():\n"
        "    assert os.path.isdir(DST)\n"
        "    assert files_under(SRC) == set() if os.path.isdir(SRC) else True\n",
    ]
    for i, chunk in enumerate(chunks):
        tests.append(f"def test_folders_group_{i + 1}():\n    check_folders({literal(sorted(chunk))})\n")
    tests.append("def test_no_unexpected_files():\n"
                 "    found = files_under(DST) - ({MANIFEST} if MANIFEST else set())\n"
                 "    assert found == set(EXPECTED)\n")
    if drop_empty:
        tests.append("def test_empty_files_deleted():\n"
                     "    assert os.path.isdir(DST)\n"
                     "    names = {os.path.basename(p) for p in files_under(DST)}\n"
                     "    if os.path.isdir(SRC):\n"
                     "        names |= {os.path.basename(p) for p in files_under(SRC)}\n"
                     "    assert not names & set(EMPTIES)\n")
    if manifest:
        tests.append("def test_manifest():\n"
                     "    assert lines(os.path.join(DST, MANIFEST)) == sorted(EXPECTED, key=lambda s: s.encode())\n")

    sol = [f"ls -la {q(src)} | head -50", f"ls {q(src)} | wc -l"]
    if drop_empty:
        sol.append(f"find {q(src)} -type f -empty -print -delete")
    if mode == "ext":
        for ext in sorted(set(target.values())):
            sol.append(f"mkdir -p {q(dst + '/' + ext)} && find {q(src)} -maxdepth 1 -type f -iname '*.{ext}' "
                       f"-exec mv -t {q(dst + '/' + ext)}/ {{}} +")
    elif mode == "date":
        for ym in sorted(set(target.values())):
            y, m = ym.split("/")
            sol.append(f"mkdir -p {q(dst + '/' + ym)} && mv {q(src)}/{y}-{m}-* {q(dst + '/' + ym)}/")
    else:
        sol.append(f"mkdir -p {q(dst)}/small {q(dst)}/large")
        sol.append(f"find {q(src)} -maxdepth 1 -type f -size -{threshold}c -exec mv -t {q(dst)}/small/ {{}} +")
        sol.append(f"find {q(src)} -maxdepth 1 -type f -exec mv -t {q(dst)}/large/ {{}} +")
    sol.append(f"find {q(src)} -type f | wc -l")
    if manifest:
        sol.append(f"cd {q(dst)} && find . -type f ! -path ./{q(manifest)} | sed 's|^\\./||' | LC_ALL=C sort > "
                   f"{q(manifest)} && cd /app")
        sol.append(f"head {q(dst + '/' + manifest)}")
    return TaskDraft(instruction=instruction, tests=tests, solution=sol, test_prelude=prelude,
                     files={f"{src[5:]}/{nm}": c for nm, c in files.items()}, tags=("files", mode))


# ----------------------------------------------------------------------------------------------- archive-pack


@family("archive-pack", TRAIN, "archives", "extract, inspect and build tar/gzip archives")
def archive_pack(rng: random.Random) -> TaskDraft:
    proj = pick(rng, ["project", "workspace", "repo", "site"])
    backup = f"{pick(rng, words(rng, 'project', 5))}-{rng.randint(2019, 2025)}"
    inner = pick(rng, ["site", "data", "home", "srv"])
    log = pick(rng, ["service", "app", "daemon", "gateway"])
    out = pick(rng, ["/app/out", "/app/dist", "/app/result"])
    ext = pick(rng, ["md", "py", "csv", "txt"])
    project: dict[str, str] = {}
    for sub, e in (("docs", "md"), ("src", "py"), ("data", "csv"), ("notes", "txt"), ("cache", "bin")):
        for nm in words(rng, "animal", rng.randint(2, 5)):
            project[f"{sub}/{nm}.{e}"] = _text_blob(rng, rng.randint(20, 400))
    for nm in words(rng, "color", 2):
        project[f"{nm}.{ext}"] = _text_blob(rng, rng.randint(20, 200))
    backup_files = {f"{inner}/{d}/{nm}.txt": _text_blob(rng, rng.randint(10, 300))
                    for d in ("etc", "var", "www") for nm in words(rng, "fruit", rng.randint(1, 4))}
    log_lines = []
    for i in range(rng.randint(40, 160)):
        lvl = pick(rng, ["INFO", "INFO", "INFO", "WARN", "ERROR", "DEBUG"])
        log_lines.append(f"2024-05-{1 + i // 50:02d}T{i % 24:02d}:{i % 60:02d}:00 {lvl} {pick(rng, ['req', 'job', 'tick'])}"
                         f" id={hexid(rng)}")
    log_text = "\n".join(log_lines) + "\n"
    wanted = {p for p in project if p.endswith("." + ext)}
    pack_name = f"{pick(rng, ['bundle', 'export', 'pack', 'selection'])}-{ext}.tar.gz"
    reqs = rng.sample(["extract", "pack", "gunzip", "listing", "count"], rng.randint(3, 5))
    items, tests, sol = [], [], ["ls -R /app | head -60"]
    for r in reqs:
        if r == "extract":
            items.append(f"Extract `/app/backups/{backup}.tar.gz` into `/app/restored/`, keeping the archive's "
                         f"internal paths (e.g. its `{inner}/` folder becomes `/app/restored/{inner}/`).")
            tests.append("def test_backup_extracted():\n"
                         "    for rel, digest in BACKUP.items():\n"
                         "        p = pathlib.Path('/app/restored') / rel\n"
                         "        assert p.is_file(), p\n"
                         "        assert hashlib.sha256(p.read_bytes()).hexdigest() == digest\n")
            sol += [f"tar -tzf /app/backups/{backup}.tar.gz | head",
                    f"mkdir -p /app/restored && tar -xzf /app/backups/{backup}.tar.gz -C /app/restored"]
        elif r == "pack":
            items.append(f"{say(rng, 'create')} the gzip-compressed tar archive `{out}/{pack_name}` holding every "
                         f"`.{ext}` file under `/app/{proj}` (and nothing else), stored with paths relative to "
                         f"`/app/{proj}` (like `docs/x.{ext}`, no leading `/`).")
            tests.append("def test_pack_archive():\n"
                         "    import tarfile\n"
                         f"    with tarfile.open({out + '/' + pack_name!r}, 'r:gz') as tf:\n"
                         "        members = {os.path.normpath(m.name): m for m in tf.getmembers() if m.isfile()}\n"
                         "        assert set(members) == set(PACKED)\n"
                         "        for name, digest in PACKED.items():\n"
                         "            data = tf.extractfile(members[name]).read()\n"
                         "            assert hashlib.sha256(data).hexdigest() == digest\n")
            sol += [f"mkdir -p {out} && cd /app/{proj} && find . -type f -name '*.{ext}' | sed 's|^\\./||' | "
                    f"tar -czf {out}/{pack_name} -T - && cd /app", f"tar -tzf {out}/{pack_name}"]
        elif r == "gunzip":
            items.append(f"Decompress `/app/logs/{log}.log.gz` to `{out}/{log}.log`, leaving the `.gz` file in "
                         "place.")
            tests.append("def test_log_decompressed():\n"
                         f"    assert hashlib.sha256(pathlib.Path({out + '/' + log + '.log'!r}).read_bytes())"
                         ".hexdigest() == LOG_SHA\n"
                         f"    assert os.path.isfile('/app/logs/{log}.log.gz')\n")
            sol += [f"mkdir -p {out} && gzip -dc /app/logs/{log}.log.gz > {out}/{log}.log"]
        elif r == "listing":
            items.append(f"{say(rng, 'write')} the paths of the regular files inside `/app/backups/{backup}.tar.gz` "
                         f"to `{out}/listing.txt`, one per {say(rng, 'line')}, sorted in byte order.")
            tests.append("def test_listing():\n"
                         f"    got = [l for l in lines({out + '/listing.txt'!r}) if l.strip()]\n"
                         "    assert got == sorted(BACKUP, key=lambda s: s.encode())\n")
            sol += [f"mkdir -p {out} && tar -tzf /app/backups/{backup}.tar.gz | grep -v '/$' | LC_ALL=C sort > "
                    f"{out}/listing.txt"]
        else:
            lvl = pick(rng, ["ERROR", "WARN"])
            items.append(f"Count the lines of the compressed log `/app/logs/{log}.log.gz` whose level is `{lvl}` "
                         f"and {say(rng, 'write').lower()} just that number to `{out}/{lvl.lower()}-count.txt`.")
            n_lvl = sum(1 for ln in log_lines if f" {lvl} " in ln)
            tests.append("def test_level_count():\n"
                         f"    assert read({out + '/' + lvl.lower() + '-count.txt'!r}).strip() == {str(n_lvl)!r}\n")
            sol += [f"zcat /app/logs/{log}.log.gz | head -5",
                    f"mkdir -p {out} && zcat /app/logs/{log}.log.gz | grep -c ' {lvl} ' > {out}/{lvl.lower()}-count.txt"]
    if len(tests) < 3:
        raise AssertionError("archive-pack needs 3 requirements")
    tests.append("def test_sources_untouched():\n"
                 f"    assert os.path.isfile('/app/backups/{backup}.tar.gz')\n"
                 f"    assert os.path.isdir({out!r})\n")
    intro = pick(rng, [
        "Some archive housekeeping is needed in this machine's `/app` folder:",
        f"{say(rng, 'task')} involves tar archives and gzip files under `/app`. Do the following:",
        "Work with the archives and compressed files below:",
    ])
    instruction = compose(rng, intro, items, outro=f"Create `{out}` if it does not exist.")
    prelude = (f"BACKUP = {literal({k: sha256_text(v) for k, v in sorted(backup_files.items())})}\n"
               f"PACKED = {literal({k: sha256_text(project[k]) for k in sorted(wanted)})}\n"
               f"LOG_SHA = {sha256_text(log_text)!r}\n")
    files = {f"{proj}/{k}": v for k, v in project.items()}
    files.update({f".stage/{k}": v for k, v in backup_files.items()})
    files[f"logs/{log}.log"] = log_text
    steps = [f"RUN mkdir -p /app/backups && cd /app/.stage && tar -czf /app/backups/{backup}.tar.gz {inner} "
             f"&& cd /app && rm -rf /app/.stage && gzip -n /app/logs/{log}.log"]
    return TaskDraft(instruction=instruction, tests=tests, solution=sol, files=files, build_steps=steps,
                     test_prelude=prelude, tags=("tar", "gzip"))


# ----------------------------------------------------------------------------------------------- perms-fix

_MODE_WORDS = {
    0o755: "readable and executable by everyone, writable only by the owner",
    0o700: "accessible (read, write, enter) by the owner only",
    0o600: "readable and writable by the owner only",
    0o640: "readable and writable by the owner, readable by the group, no access for others",
    0o644: "readable by everyone, writable only by the owner",
    0o444: "read-only for everyone",
    0o1777: "world-writable with the sticky bit set, like /tmp",
    0o2775: "group-writable with the setgid bit set",
    0o750: "fully accessible by the owner, readable and enterable by the group, closed to others",
}


@family("perms-fix", TRAIN, "permissions", "repair file and directory permission bits to a policy")
def perms_fix(rng: random.Random) -> TaskDraft:
    root = "/app/" + pick(rng, ["deploy", "service", "webroot", "release", "stack"])
    scripts = [f"bin/{w}.sh" for w in words(rng, "animal", rng.randint(2, 4))]
    secrets = [f"secrets/{w}.{pick(rng, ['key', 'pem', 'token'])}" for w in words(rng, "color", rng.randint(2, 3))]
    configs = [f"config/{w}.conf" for w in words(rng, "component", rng.randint(2, 4))]
    pages = [f"public/{w}.html" for w in words(rng, "fruit", rng.randint(2, 4))]
    readonly = f"config/{pick(rng, ['release', 'version', 'build'])}.lock"
    shared = pick(rng, ["uploads", "shared", "spool"])
    shared_mode = pick(rng, [0o1777, 0o2775])
    rules = rng.sample(["scripts", "secrets", "configs", "pages", "readonly", "shared", "noworld"], rng.randint(4, 6))
    contents = {p: f"# {p}\n" + _text_blob(rng, rng.randint(10, 120)) for p in scripts + secrets + configs + pages}
    for p in scripts:
        contents[p] = "#!/bin/sh\necho " + p + "\n"
    contents[readonly] = f"build={hexid(rng, 12)}\n"
    contents[f"{shared}/.keep"] = ""
    init: dict[str, int] = {}
    for p in scripts:
        init[p] = pick(rng, [0o644, 0o600, 0o666])
    for p in secrets:
        init[p] = pick(rng, [0o644, 0o666, 0o755])
    for p in configs:
        init[p] = pick(rng, [0o666, 0o777, 0o604])
    for p in pages:
        init[p] = pick(rng, [0o600, 0o666, 0o700])
    init[readonly] = pick(rng, [0o644, 0o664, 0o666])
    init[f"{shared}/.keep"] = 0o644
    init["secrets"] = pick(rng, [0o755, 0o777])
    init[shared] = 0o755
    want: dict[str, int] = {}
    groups: dict[str, list[str]] = {}
    items, sol = [], [f"ls -lR {root}"]

    def mode_text(m: int) -> str:
        return pick(rng, [f"mode `{m:o}`", f"{_MODE_WORDS[m]} (`{m:o}`)", _MODE_WORDS[m] + f" — octal {m:04o}"])

    def require(group: str, paths: list[str], mode: int) -> None:
        want.update({p: mode for p in paths})
        groups.setdefault(group, []).extend(paths)

    for r in rules:
        if r == "scripts":
            require(r, scripts, 0o755)
            items.append(f"Every shell script in `{root}/bin/` must be {mode_text(0o755)}.")
            sol.append(f"chmod 755 {root}/bin/*.sh")
        elif r == "secrets":
            require(r, secrets, 0o600)
            require(r, ["secrets"], 0o700)
            items.append(f"Files in `{root}/secrets/` must be {mode_text(0o600)}, and the `secrets` directory "
                         f"itself {mode_text(0o700)}.")
            sol.append(f"chmod 600 {root}/secrets/* && chmod 700 {root}/secrets")
        elif r == "configs":
            require(r, configs, 0o640)
            items.append(f"The `.conf` files in `{root}/config/` must be {mode_text(0o640)}.")
            sol.append(f"chmod 640 {root}/config/*.conf")
        elif r == "pages":
            require(r, pages, 0o644)
            items.append(f"The HTML pages in `{root}/public/` must be {mode_text(0o644)}.")
            sol.append(f"chmod 644 {root}/public/*.html")
        elif r == "readonly":
            require(r, [readonly], 0o444)
            items.append(f"`{root}/{readonly}` must be {mode_text(0o444)}.")
            sol.append(f"chmod 444 {root}/{readonly}")
        elif r == "shared":
            require(r, [shared], shared_mode)
            items.append(f"The directory `{root}/{shared}` must be {mode_text(shared_mode)}.")
            sol.append(f"chmod {shared_mode:o} {root}/{shared}")
        else:
            items.append(f"No regular file anywhere under `{root}` may be writable by others (remove the "
                         "others-write bit wherever it is set, changing nothing else about those files).")
            sol.append(f"find {root} -type f -perm -o+w -exec chmod o-w {{}} +")
    noworld: dict[str, int] = {}
    if "noworld" in rules:
        if not any(init[p] & 0o002 for p in contents if p not in want):
            victim = pick(rng, sorted(p for p in contents if p not in want) or [configs[0]])
            init[victim] = 0o666
        noworld = {p: init[p] & ~0o002 for p in sorted(contents) if init[p] & 0o002 and p not in want}
    sol.append(f"stat -c '%a %n' $(find {root} -mindepth 1 | sort)")
    intro = pick(rng, [
        f"A deployment under `{root}` was unpacked with the wrong permission bits. Fix them:",
        f"{say(rng, 'task')}: bring the permissions under `{root}` in line with this policy.",
        f"Security review findings for `{root}` — set the permissions as follows:",
    ])
    instruction = compose(rng, intro, items, outro="Do not delete, rename or edit any file.")
    prelude = f"ROOT = {root!r}\nWANT = {literal({k: want[k] for k in sorted(want)})}\n\n\n" + (
        "def check(paths):\n"
        "    for rel in paths:\n"
        "        got = stat.S_IMODE(os.stat(os.path.join(ROOT, rel)).st_mode)\n"
        "        assert got == WANT[rel], f'{rel}: mode {got:o}, want {WANT[rel]:o}'\n")
    tests = [f"def test_{k}_modes():\n    check({literal(sorted(v))})\n" for k, v in sorted(groups.items())]
    tests.append("def test_contents_unchanged():\n"
                 f"    for rel, digest in {literal({k: sha256_text(v) for k, v in sorted(contents.items())})}.items():\n"
                 "        assert hashlib.sha256(pathlib.Path(ROOT, rel).read_bytes()).hexdigest() == digest\n")
    if "noworld" in rules:
        tests.append("def test_no_world_writable_files():\n"
                     "    for dirpath, _d, names in os.walk(ROOT):\n"
                     "        for nm in names:\n"
                     "            assert not os.stat(os.path.join(dirpath, nm)).st_mode & 0o002, nm\n"
                     f"    for rel, mode in {literal(noworld)}.items():\n"
                     "        assert stat.S_IMODE(os.stat(os.path.join(ROOT, rel)).st_mode) == mode, rel\n")
    by_mode: dict[int, list[str]] = {}
    for p, m in sorted(init.items()):
        by_mode.setdefault(m, []).append(p)
    chmods = " && ".join(f"chmod {m:o} " + " ".join(q(p) for p in ps) for m, ps in sorted(by_mode.items()))
    files = {f"{root[5:]}/{k}": v for k, v in contents.items()}
    return TaskDraft(instruction=instruction, tests=tests, solution=sol, files=files, test_prelude=prelude,
                     build_steps=[f"RUN cd {root} && {chmods}"], tags=("chmod",))


# ----------------------------------------------------------------------------------------------- dir-sync


@family("dir-sync", HELDOUT, "file-operations", "compare two trees, report differences, then sync the mirror")
def dir_sync(rng: random.Random) -> TaskDraft:
    a_name, b_name = pick(rng, [("primary", "mirror"), ("source", "replica"), ("live", "backup"),
                                ("master", "copy"), ("origin", "clone")])
    a, b = f"/app/{a_name}", f"/app/{b_name}"
    rep = pick(rng, ["/app/report", "/app/sync-report", "/app/audit"])
    single = rng.random() < 0.5
    tree: dict[str, str] = {}
    for d in rng.sample(["etc", "lib", "share", "docs", "bin", "var/cache", "var/lib", "assets/img"], rng.randint(3, 5)):
        for nm in words(rng, pick(rng, ["fruit", "animal", "city"]), rng.randint(3, 7)):
            tree[f"{d}/{nm}.{pick(rng, ['txt', 'cfg', 'dat', 'json'])}"] = _text_blob(rng, rng.randint(5, 200))
    paths = sorted(tree)
    rng.shuffle(paths)
    k1, k2, k3 = rng.randint(1, 4), rng.randint(1, 4), rng.randint(1, 3)
    missing = sorted(paths[:k1])
    changed = sorted(paths[k1:k1 + k2])
    mirror = {p: tree[p] for p in tree if p not in missing}
    for p in changed:
        mirror[p] = tree[p][:-1] + "~\n" if rng.random() < 0.5 else _text_blob(rng, len(tree[p]) + 3)
    extra = sorted(f"{pick(rng, ['tmp', 'old', 'etc', 'lib'])}/{w}-{hexid(rng, 4)}.bak" for w in words(rng, "color", k3))
    for p in extra:
        mirror[p] = _text_blob(rng, rng.randint(5, 60))
    if single:
        rname = pick(rng, ["differences.txt", "diff-report.txt", "drift.txt"])
        fmt = (f"{say(rng, 'write')} `{rep}/{rname}` with one line per difference: `MISSING <path>` for files in "
               f"`{a}` that `{b}` lacks, `CHANGED <path>` for files present in both with different content, and "
               f"`EXTRA <path>` for files only in `{b}`. Paths are relative to the tree root (e.g. `etc/x.txt`); "
               "sort the lines in byte order.")
        lines_ = sorted([f"MISSING {p}" for p in missing] + [f"CHANGED {p}" for p in changed] +
                        [f"EXTRA {p}" for p in extra], key=str.encode)
        report_tests = [f"def test_report_{kind.lower()}():\n"
                        f"    got = [l for l in lines({rep + '/' + rname!r}) if l.startswith('{kind} ')]\n"
                        f"    assert got == {literal([l for l in lines_ if l.startswith(kind + ' ')])}\n"
                        for kind in ("MISSING", "CHANGED", "EXTRA")]
        report_cmds = [printf_lines(f"{rep}/{rname}", lines_)]
    else:
        fnames = {"missing": "missing.txt", "changed": "changed.txt", "extra": "extra.txt"}
        fmt = (f"{say(rng, 'write')} three files in `{rep}`: `missing.txt` (files in `{a}` that `{b}` lacks), "
               f"`changed.txt` (files in both whose content differs) and `extra.txt` (files only in `{b}`). Each "
               "holds paths relative to the tree root (e.g. `etc/x.txt`), one per line, sorted in byte order.")
        report_tests = [f"def test_report_{k}():\n"
                        f"    assert [l for l in lines({rep + '/' + fnames[k]!r}) if l] == {literal(v)}\n"
                        for k, v in (("missing", missing), ("changed", changed), ("extra", extra))]
        report_cmds = [printf_lines(f"{rep}/{fnames[k]}", v) if v else f": > {rep}/{fnames[k]}"
                       for k, v in (("missing", missing), ("changed", changed), ("extra", extra))]
    items = [fmt, f"{say(rng, 'then')} make `{b}` an exact copy of `{a}`: same files with the same contents, and "
             f"no files that `{a}` does not have.", f"`{a}` itself must not be modified."]
    intro = pick(rng, [
        f"`{b}` is supposed to mirror `{a}`, but the two have drifted apart.",
        f"Two directory trees, `{a}` and its copy `{b}`, no longer match.",
        f"{say(rng, 'task')} is to reconcile `{b}` with the reference tree `{a}`.",
    ])
    instruction = compose(rng, intro, items, outro="Record the differences before you sync (the report must "
                                                   "describe the trees as they were given to you).")
    prelude = (f"A, B = {a!r}, {b!r}\nTREE = {literal({p: sha256_text(tree[p]) for p in sorted(tree)})}\n\n\n"
               "def snapshot(root):\n"
               "    out = {}\n"
               "    for dirpath, _d, names in os.walk(root):\n"
               "        for nm in names:\n"
               "            p = os.path.join(dirpath, nm)\n"
               "            out[os.path.relpath(p, root)] = hashlib.sha256(pathlib.Path(p).read_bytes()).hexdigest()\n"
               "    return out\n")
    tests = report_tests + [
        "def test_mirror_synced():\n    assert snapshot(B) == TREE\n",
        "def test_source_untouched():\n    assert snapshot(A) == TREE\n",
    ]
    sol = [f"diff -rq {a} {b}", f"mkdir -p {rep}"] + report_cmds
    sol += [f"cp -a {a}/. {b}/", "rm -f " + " ".join(q(f"{b}/{p}") for p in extra),
            f"find {b} -type d -empty -delete", f"diff -r {a} {b} && echo in-sync"]
    files = {f"{a_name}/{p}": c for p, c in tree.items()}
    files.update({f"{b_name}/{p}": c for p, c in mirror.items()})
    return TaskDraft(instruction=instruction, tests=tests, solution=sol, files=files, test_prelude=prelude,
                     difficulty="medium", tags=("diff", "sync"))
