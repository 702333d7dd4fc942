"""The default tokenizer corpus: generated shell sessions plus the text files shipped in `conch/model/corpus/`.

Why generated: the tokenizer must be trainable with no network and give the same vocabulary on every machine.
A seeded generator of commands, outputs (listings, tracebacks, git/pytest/compiler output) and task-like
instructions, written in the same chat format the agent uses, gives BPE merges that fit terminal work (paths,
flags, JSON tool calls, chat markers) far better than generic prose would. Same seed -> same text, byte for byte.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from pathlib import Path

SHIPPED_DIR = Path(__file__).with_name("corpus")
TEXT_SUFFIXES = {".txt", ".md", ".sh", ".py", ".toml", ".yaml", ".yml", ".cfg", ".ini", ".c", ".rs", ".go", ".js",
                 ".json", ".jsonl", ".csv", ".log", ".html", ".css", ".sql", ".Dockerfile", ""}

WORDS = ("file directory output input config data test build server client error result value list table user "
         "process script module package library service request response cache index report log backup archive "
         "record entry field column row header message queue task job worker pipeline model token string number "
         "count total line word path name version branch commit patch diff merge release image container volume "
         "network port host socket thread signal memory disk limit timeout retry status check verify parse format "
         "convert compress extract install update remove create delete rename copy move sort filter search find "
         "match replace split join read write open close start stop restart run execute compile link debug fix "
         "account address agent alert amount api app argument array asset attribute audit auth author backend "
         "balance batch binary bit block body boolean bound bucket buffer bug byte callback cart category cell "
         "certificate channel char chunk class cluster code collection color command comment component condition "
         "connection constant content context controller cookie core counter credential cursor customer daemon "
         "dashboard database date day debugger decimal default dependency deploy device dict document domain "
         "driver edge element email encoding endpoint engine environment event exception exit export expression "
         "factory feature fetch filename flag float folder font frame function gateway generator graph group hash "
         "handler helper history hook http icon image import instance integer interface invoice item iterator "
         "json kernel key label layer layout length level lock logger loop manager map matrix method metric "
         "middleware migration mode monitor mount mutex node object offset option order owner page parameter "
         "parent parser partition password payload peer permission pointer policy pool post prefix price "
         "printer priority profile program project property protocol provider proxy query random range reader "
         "receiver reference region registry regex remote render repo resource route rule runner sample schema "
         "scope secret section selector sensor session setting shell size slot snapshot source stack state "
         "storage stream struct subject summary symbol system target template tenant terminal text thing ticket "
         "timer timestamp tool tree trigger tuple type unit upload url usage utility validator variable vector "
         "vendor view window wrapper zone alpha beta gamma delta apple banana cherry orange river mountain city "
         "country student teacher school book chapter movie music song weather temperature station train flight "
         "hotel price sale order product employee salary department manager project invoice payment").split()
DIRS = ("/app", "/home/user", "/tmp", "/var/log", "/etc", "/usr/local/bin", "/opt/project", "/srv/data", "/root",
        "/workspace", "/app/src", "/app/tests", "/data", "/var/lib/app", "/usr/share/doc")
EXTS = (".py", ".txt", ".json", ".csv", ".log", ".sh", ".c", ".h", ".rs", ".go", ".js", ".md", ".yaml", ".toml",
        ".conf", ".sql", ".html", ".tar.gz", ".zip", ".out")
LANG_SNIPPETS = (
    "def main():\n    args = parse_args()\n    with open(args.path) as f:\n        data = json.load(f)\n    return 0\n",
    "import os\nimport sys\n\nfor root, dirs, files in os.walk(sys.argv[1]):\n    print(root, len(files))\n",
    "#include <stdio.h>\n\nint main(int argc, char **argv) {\n    printf(\"%d\\n\", argc);\n    return 0;\n}\n",
    "fn main() {\n    let v: Vec<i32> = (1..10).collect();\n    println!(\"{:?}\", v);\n}\n",
    "SELECT name, COUNT(*) FROM users WHERE active = 1 GROUP BY name ORDER BY 2 DESC LIMIT 10;\n",
    "#!/bin/bash\nset -euo pipefail\nfor f in *.log; do\n  gzip -9 \"$f\"\ndone\n",
    "package main\n\nimport \"fmt\"\n\nfunc main() {\n\tfmt.Println(\"hello\")\n}\n",
    "const fs = require('fs');\nconst data = fs.readFileSync(process.argv[2], 'utf8');\nconsole.log(data.length);\n",
)
ERRORS = (
    "bash: {w}: command not found", "cat: {p}: No such file or directory", "rm: cannot remove '{p}': Permission denied",
    "mkdir: cannot create directory '{p}': File exists", "grep: {p}: Is a directory",
    "fatal: not a git repository (or any of the parent directories): .git",
    "make: *** No rule to make target '{w}'.  Stop.",
    "error: externally-managed-environment", "Segmentation fault (core dumped)", "Killed",
    "E: Unable to locate package {w}", "ModuleNotFoundError: No module named '{w}'",
    "SyntaxError: invalid syntax", "curl: (7) Failed to connect to localhost port {n}: Connection refused",
)
INSTRUCTIONS = (
    "Create a file named {p} that contains the word {w}.", "Find every {e} file under {d} and count the lines.",
    "Fix the failing test in {p} without changing the test itself.", "Compress the logs in {d} into one archive.",
    "Write a script that prints the {n} largest files in {d}.", "The server on port {n} does not start. Find out why.",
    "Parse {p} and write the total of the second column to /app/answer.txt.",
    "Install the missing dependency and make `make test` pass.", "Rename all {e} files in {d} to lowercase.",
    "Set up a cron job that backs up {d} every night.", "Extract the archive {p} and report how many files it holds.",
    "Convert the CSV file {p} into JSON with one object per row.", "Find the commit that introduced the bug in {w}.",
)


class _Gen:
    def __init__(self, rng: random.Random) -> None:
        self.r = rng

    def word(self) -> str:
        return self.r.choice(WORDS)

    def name(self) -> str:
        parts = [self.word() for _ in range(self.r.randint(1, 2))]
        return self.r.choice(("_", "-", "")).join(parts) + self.r.choice(EXTS)

    def path(self) -> str:
        return f"{self.r.choice(DIRS)}/{self.name()}"

    def num(self) -> int:
        return self.r.choice((self.r.randint(0, 9), self.r.randint(10, 999), self.r.randint(1000, 99999)))

    def fill(self, template: str) -> str:
        return template.format(w=self.word(), p=self.path(), d=self.r.choice(DIRS), e=self.r.choice(EXTS),
                               n=self.num())

    def command(self) -> str:
        r, p, d, w, n = self.r, self.path(), self.r.choice(DIRS), self.word(), self.num()
        options = (
            f"ls -la {d}", f"cd {d} && ls", f"cat {p}", f"head -n {n % 50 + 1} {p}", f"tail -f {p}",
            f"grep -rn '{w}' {d}", f"grep -c {w} {p}", f"find {d} -name '*{r.choice(EXTS)}' -type f",
            f"find . -size +{n}k -mtime -7", f"wc -l {p}", f"sort -u {p} | uniq -c | sort -rn | head",
            f"sed -i 's/{w}/{self.word()}/g' {p}", f"awk -F, '{{print $2}}' {p} | sort -n | tail -1",
            f"mkdir -p {d}/{w}", f"rm -rf {d}/{w}", f"cp {p} {d}/", f"mv {p} {p}.bak", f"chmod +x {p}",
            f"tar -czf {w}.tar.gz {d}", f"tar -xzf {w}.tar.gz -C /tmp", f"python3 {p}", "python3 -m pytest -q",
            f"python3 -c 'import {w}; print({w}.__version__)'", f"pip install {w}=={n % 5}.{n % 13}.{n % 7}",
            f"apt-get install -y {w}", "git status", "git log --oneline -5", f"git diff HEAD~1 -- {p}",
            f"git checkout -b fix-{w}", f"git commit -am 'Fix {w} {self.word()}'", "make", "make test",
            f"gcc -O2 -o {w} {w}.c", f"cargo build --release", f"go run {w}.go", f"node {w}.js",
            f"echo \"{w}\" > {p}", f"printf '%s\\n' {w} {self.word()} >> {p}", f"export PATH={d}:$PATH",
            f"ps aux | grep {w}", f"kill -9 {n}", "df -h", f"du -sh {d}", f"curl -s http://localhost:{n}/{w}",
            f"jq '.{w}' {p}", f"sqlite3 {w}.db 'SELECT * FROM {w};'", f"xargs -n1 < {p}", "env | sort",
            f"which {w}", f"diff -u {p} {p}.orig", f"file {p}", f"stat {p}", f"md5sum {p}", f"ln -s {p} {d}/{w}",
            f"cat > {p} << 'EOF'\n{r.choice(LANG_SNIPPETS)}EOF",
        )
        return r.choice(options)

    def listing(self) -> str:
        rows = []
        for _ in range(self.r.randint(2, 8)):
            perm = self.r.choice(("-rw-r--r--", "drwxr-xr-x", "-rwxr-xr-x", "-rw-------", "lrwxrwxrwx"))
            month = self.r.choice(("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov"))
            rows.append(f"{perm} 1 root root {self.num():>6} {month} {self.r.randint(1, 28):>2} "
                        f"{self.r.randint(0, 23):02d}:{self.r.randint(0, 59):02d} {self.name()}")
        return f"total {self.num()}\n" + "\n".join(rows)

    def output(self) -> str:
        r = self.r
        kind = r.randint(0, 9)
        if kind == 0:
            return self.listing()
        if kind == 1:
            return self.fill(r.choice(ERRORS))
        if kind == 2:
            return (f"Traceback (most recent call last):\n  File \"{self.path()}\", line {self.num()}, in <module>\n"
                    f"    {self.word()}()\n{r.choice(('ValueError', 'KeyError', 'TypeError', 'OSError'))}: "
                    f"{self.word()} {self.word()}")
        if kind == 3:
            return (f"On branch {self.word()}\nChanges not staged for commit:\n  modified:   {self.name()}\n\n"
                    f"Untracked files:\n  {self.name()}")
        if kind == 4:
            passed, failed = self.num() % 40, self.num() % 4
            return f"{'.' * passed}{'F' * failed}\n{failed} failed, {passed} passed in {r.random() * 9:.2f}s"
        if kind == 5:
            return json.dumps({self.word(): self.num(), self.word(): [self.word(), self.num()], "ok": r.random() > .5})
        if kind == 6:
            return "\n".join(",".join(str(self.num()) if r.random() > .4 else self.word() for _ in range(4))
                             for _ in range(r.randint(2, 6)))
        if kind == 7:
            return r.choice(LANG_SNIPPETS)
        if kind == 8:
            return f"{self.name()}:{self.num()}: error: '{self.word()}' undeclared (first use in this function)"
        return "\n".join(self.misc() for _ in range(r.randint(1, 5)))

    def misc(self) -> str:
        r = self.r
        kind = r.randint(0, 5)
        if kind == 0:
            return f"{r.getrandbits(28):07x} {self.word().capitalize()} {self.word()} {self.word()}"
        if kind == 1:
            return (f"2024-{r.randint(1, 12):02d}-{r.randint(1, 28):02d}T{r.randint(0, 23):02d}:"
                    f"{r.randint(0, 59):02d}:{r.randint(0, 59):02d}Z {r.choice(('INFO', 'WARN', 'ERROR', 'DEBUG'))} "
                    f"{self.word()}: {self.word()} {self.word()}")
        if kind == 2:
            return f"{r.randint(10, 192)}.{r.randint(0, 255)}.{r.randint(0, 255)}.{r.randint(1, 254)}:{self.num()}"
        if kind == 3:
            a, b = self.word(), self.word()
            return r.choice((f"{a}_{b}", f"{a}{b.capitalize()}", f"{a.upper()}_{b.upper()}", f"{a}.{b}()"))
        if kind == 4:
            return f"{self.word()}=={r.randint(0, 9)}.{r.randint(0, 30)}.{r.randint(0, 20)}"
        return str(self.num())

    def episode(self) -> str:
        """One chat-formatted agent episode, as the template renders it."""
        r = self.r
        parts = ["<|im_start|>system\nYou are a helpful assistant working in a Linux terminal.<|im_end|>\n",
                 f"<|im_start|>user\n{self.fill(r.choice(INSTRUCTIONS))}<|im_end|>\n"]
        for turn in range(r.randint(1, 5)):
            think = f"<think>\nI should {self.word()} the {self.word()} first.\n</think>\n\n" if r.random() < .5 else ""
            call = json.dumps({"name": "bash", "arguments": {"command": self.command()}}, ensure_ascii=False)
            parts.append(f"<|im_start|>assistant\n{think}<tool_call>\n{call}\n</tool_call><|im_end|>\n")
            parts.append(f"<|im_start|>user\n<tool_response>\n{self.output()}\n</tool_response><|im_end|>\n")
        call = json.dumps({"name": "submit", "arguments": {}})
        parts.append(f"<|im_start|>assistant\nDone.\n<tool_call>\n{call}\n</tool_call><|im_end|>\n<|endoftext|>")
        return "".join(parts)


def generated_corpus(seed: int = 0, episodes: int = 2500) -> Iterator[str]:
    """Deterministic synthetic shell text: chat episodes interleaved with bare command/output pairs."""
    gen = _Gen(random.Random(seed))
    for i in range(episodes):
        yield gen.episode()
        if i % 2 == 0:
            yield f"$ {gen.command()}\n{gen.output()}\n"


def shipped_texts() -> Iterator[str]:
    for path in sorted(SHIPPED_DIR.glob("*.txt")):
        yield path.read_text(encoding="utf-8")


def _strings_in(value: object) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _strings_in(v)
    elif isinstance(value, list):
        for v in value:
            yield from _strings_in(v)


def read_corpus_path(path: Path) -> Iterator[str]:
    """Texts from a file or folder (recursively, text files only, sorted for determinism).

    JSON/JSONL files contribute their string values (so escaped text is learned unescaped)."""
    if not path.exists():
        raise FileNotFoundError(f"tokenizer corpus path does not exist: {path}")
    files = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
    for f in files:
        if path.is_dir() and f.suffix not in TEXT_SUFFIXES:
            continue
        try:
            text = f.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue  # binary or unreadable files are not corpus
        if f.suffix == ".jsonl":
            for line in text.splitlines():
                try:
                    yield from _strings_in(json.loads(line))
                except json.JSONDecodeError:
                    yield line
        elif f.suffix == ".json":
            try:
                yield from _strings_in(json.loads(text))
            except json.JSONDecodeError:
                yield text
        else:
            yield text
