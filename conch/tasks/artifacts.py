"""What a paraphrase of a task cannot change: its concrete artifacts, its content words, its files.

A contaminating synthesizer that rewords a benchmark task keeps the task itself: the paths it reads and writes
(`/app/ars.R`), file names, URLs, ports, versions, identifiers (`run_tasks`, `KVStore`), expected output strings
and formats, the Docker image, and often byte-identical test or solution files. Word n-grams and edit distance
(conch/tasks/decontam.py) do not see that: a free rewording shares almost no 8-grams and keeps little of the
word order. This module reduces a task to three things that survive rewording:

- `extract_artifacts`: the set of concrete artifacts in a text, each with a specificity weight (a full path or
  an identifier says far more than a bare small integer or a generic name such as `output.txt`); a key with
  a space in it (an expected output line, a command) is a phrase, matched as a word sequence anywhere in the
  other task's text, so quoting or punctuation differences do not hide it;
- `content_words`: a bag of stemmed content words (stop words dropped), for a TF-IDF cosine that ignores
  word order and grammar, which is what a paraphrase changes;
- `file_fingerprints`: hashes of the task's test, solution and environment files, whitespace-normalized, so a
  copied verifier is recognised whatever the instruction says.

Everything here is plain functions on strings and folders; the weighting against the reference set (IDF) and
the scoring live in decontam.py.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from pathlib import Path

FILE_DIRS = ("tests", "solution", "environment")
MAX_FILE_BYTES = 1_000_000
MIN_FILE_BYTES = 64  # shorter files (an empty __init__.py, a one-line script) are not evidence
# File stems so common in task texts that sharing one says little (weight x0.25).
GENERIC_STEMS = frozenset("""output out outputs result results answer answers solution solutions data input
inputs test tests main readme log logs config settings file files tmp temp app src index report summary notes
run script setup requirements server client""".split())
FILE_EXTENSIONS = frozenset("""txt csv tsv json jsonl yaml yml toml ini cfg conf env log md rst adoc tex bib html htm
css xml svg py pyc ipynb c h cc cpp hpp cxx rs go js mjs ts jsx tsx java class jar kt scala rb php pl lua hs ml mli
v lean r jl swift m f90 asm s o so a out elf exe dll wasm sh bash zsh fish ps1 bat sql db sqlite sqlite3 wal tar gz
tgz zip 7z bz2 xz zst rar png jpg jpeg gif bmp tiff webp pdf mp4 mkv avi mov mp3 wav flac ogg iso img qcow2 vmdk
ckpt pt pth onnx safetensors gguf bin npy npz pkl pickle parquet arrow feather h5 hdf5 bpe model vocab proto pem
crt key csr pub der p12 gpg asc patch diff lock dockerfile gcode pov stl obj ply mtl cob cbl lisp scm el vim""".split())
STOP_WORDS = frozenset("""a an the and or of to in on for with by at from as is are be been being was were it its
this that these those you your we our i me my he she they them their there here which who whom what when where why
how not no nor but if then than so such can could should would will shall may might must do does did done have
has had having into onto out up down over under about above below after before again further once all any both
each few more most other some same own only very just also too don use using used make made sure please need needs
want like get got let lets one two way ways e g ie eg etc""".split())

_URL = re.compile(r"\bhttps?://[^\s`'\"<>)\]}]+")
_PATH = re.compile(r"(?<![\w.:/])(?:~|\.{1,2})?/(?:[\w.@+\-]+/)*[\w.@+\-]*[A-Za-z][\w.@+\-]*")
_FILE = re.compile(r"(?<![\w/.\-])[\w\-]+(?:\.[\w\-]+)*\.[A-Za-z][A-Za-z0-9]{0,5}\b")
_VERSION = re.compile(r"(?<![\w.])v?\d+(?:\.\d+){1,3}(?!\w|\.\d)")
_INT = re.compile(r"(?<![\w.\-])\d{2,}(?!\w|\.\d)")
# Whole tokens mixing letters and digits: e2e4, mk4s, 8XD, Qwen2.5-1.5B-Instruct, org/model-v1.5.
_MIXED = re.compile(r"(?<![\w./\-])(?=[\w./\-]*\d)(?=[\w./\-]*[A-Za-z])[A-Za-z0-9][\w.\-]*(?:/[\w.\-]+)?[A-Za-z0-9]")
_DATE = re.compile(r"\b\d{4}-\d{2}-\d{2}\b")
_FORMAT = re.compile(r"\b[A-Z]{1,4}(?:[\-_:/.][A-Z]{1,4})+\b")  # YYYY-MM-DD, HH:MM:SS
_HEX = re.compile(r"\b[0-9a-f]{12,64}\b")
_SNAKE = re.compile(r"\b[A-Za-z][A-Za-z0-9]*_[A-Za-z0-9_]+\b")
_CAMEL = re.compile(r"\b[a-z]+[A-Z][A-Za-z0-9]*\b|\b[A-Z][a-z0-9]+[A-Z][A-Za-z0-9]*\b|\b[A-Z]{2,}[a-z][A-Za-z0-9]*\b")
_CAPS = re.compile(r"\b[A-Z][A-Z0-9]{2,}\b")
_DOLLAR = re.compile(r"\$[A-Za-z_]\w*")
_CODE = re.compile(r"`([^`\n]{3,100})`")
_QUOTED = re.compile(r"\"([^\"\n]{4,80})\"|'([^'\n]{4,80})'")
_KEY = re.compile(r"\"([A-Za-z0-9][\w\-]{1,40})\"")
_ASSIGN = re.compile(r"\b([A-Za-z_]\w*=)")
_WORD = re.compile(r"[a-z][a-z0-9]+")
_IMAGE = re.compile(r"(?m)^\s*docker_image\s*=\s*[\"']([^\"'\n]+)[\"']")
_STRIP = ".,;:!?()[]{}<>'\"`*"

# (pattern, kind, weight): the weight is how specific one such artifact is on its own.
# URLs, paths and file names come first and are blanked out of the text: their pieces are not artifacts again.
_PATTERNS = ((_URL, "url", 1.0), (_PATH, "path", 1.0), (_FILE, "file", 1.0), (_VERSION, "version", 1.0),
             (_DATE, "version", 1.0), (_HEX, "hex", 1.0), (_SNAKE, "ident", 1.0), (_CAMEL, "ident", 1.0),
             (_DOLLAR, "ident", 1.0), (_FORMAT, "ident", 1.0), (_MIXED, "ident", 0.75), (_ASSIGN, "ident", 0.75),
             (_CAPS, "caps", 0.5), (_INT, "number", 0.5))


def _file_key(name: str) -> tuple[str, float]:
    """A file name's key and weight: the basename, so `/app/out.txt` and `out.txt` are the same artifact.

    A name whose extension is no known file type (`requests.get`, `r.json` is fine) may be code: weight 0.5."""
    base = name.rstrip("/").rsplit("/", 1)[-1]
    stem = base.split(".", 1)[0]
    generic = stem in GENERIC_STEMS or len(stem) <= 1 or stem.startswith(("test_", "test-"))
    known = base.rsplit(".", 1)[-1].lower() in FILE_EXTENSIONS
    return base, (0.25 if generic else 1.0 if known else 0.5)


def extract_artifacts(text: str) -> dict[str, float]:
    """Concrete artifacts of `text` -> specificity weight in (0, 1]. Keys are lowercased.

    A path whose last component has an extension is keyed by its basename (the same file whether the text
    says `/app/x.py` or `x.py`); a directory path is kept whole, and `/app` alone is no evidence at all.
    Quoted strings and code spans are kept whole (an expected output line, a command).
    """
    out: dict[str, float] = {}

    def add(key: str, weight: float) -> None:
        key = key.strip(_STRIP).lower()
        if len(key) >= 2 and weight > out.get(key, 0.0):
            out[key] = weight

    masked = text
    for rx, kind, weight in _PATTERNS:
        if kind in ("url", "path", "file"):  # whole names first; their pieces are not artifacts of their own
            spans = list(rx.finditer(masked))
            masked = rx.sub(lambda m: " " * len(m.group(0)), masked)
        else:
            spans = list(rx.finditer(masked))
        for m in spans:
            s = m.group(1) if rx.groups else m.group(0)
            s = s.strip(_STRIP)
            if kind == "path":
                last = s.rstrip("/").rsplit("/", 1)[-1]
                if "." in last.strip("."):
                    add(*_file_key(s))
                elif s.count("/") >= 2 or (s.startswith("/") and last not in GENERIC_STEMS and len(last) > 3):
                    add(s.rstrip("/"), 1.0)
                continue
            if kind == "file":
                if re.fullmatch(r"[\d.]+", s) or s.lower() in ("e.g", "i.e"):
                    continue
                add(*_file_key(s))
                continue
            if s.lower() in STOP_WORDS:
                continue
            add(s, weight)
    for m in _CODE.finditer(text):
        if " " in m.group(1).strip():
            add(" ".join(m.group(1).split()), 1.0)
    for m in _QUOTED.finditer(text):
        s = " ".join((m.group(1) or m.group(2)).split())
        if " " in s and re.search(r"[A-Za-z]{3}", s):
            add(s, 1.0)
    for m in _KEY.finditer(text):  # a quoted single word: a JSON key, an expected value
        if m.group(1).lower() not in STOP_WORDS:
            add(m.group(1), 0.5)
    return out


_CHUNK = re.compile(r"[\s\"'`()\[\]{}<>,;|]+")
_SUBPART = re.compile(r"[=:@]+")
_PIECES = re.compile(r"\w{2,}")


def candidate_keys(text: str) -> set[str]:
    """Every string of `text` that could equal an artifact key of `extract_artifacts`, cheaply: the text's
    chunks between spaces, quotes and brackets, stripped, with their basenames, `=`/`:`/`@` parts and words.

    The task side only needs to know which *reference* artifacts it contains, so a superset of keys (most of
    them never matching) is enough, and a few string operations per word are ten times cheaper than running
    the extraction patterns over every test and solution file. Phrases are matched on words, not here.
    """
    low = text.lower()
    out = set(_PIECES.findall(low))  # pieces: `weekly_sales` of weekly_sales.json, `home` of $HOME
    for chunk in set(_CHUNK.split(low)):  # texts repeat their words: each distinct chunk once
        chunk = chunk.strip(_STRIP)
        if len(chunk) < 2 or chunk in out:
            continue
        out.add(chunk)
        if "=" in chunk or ":" in chunk or "@" in chunk:
            out.update(p.strip(_STRIP) for p in _SUBPART.split(chunk))
        if "/" in chunk:
            for part in (chunk, *_SUBPART.split(chunk)):
                part = part.strip(_STRIP + "/")
                if "/" not in part:
                    continue
                out.add(part)
                out.add(part.rsplit("/", 1)[1])
                rooted = part if part.startswith(("~", ".")) else "/" + part
                while "/" in rooted[1:]:  # the path and its folders: /srv/q/x.bin names /srv/q too
                    out.add(rooted)
                    rooted = rooted.rsplit("/", 1)[0]
    return out


def stem(word: str) -> str:
    """A crude, fast stemmer (suffix, final e, six-letter prefix): 'sorted', 'sorting' and 'sorts' meet, and
    so do 'merge' and 'merged'."""
    for suffix in ("ing", "ed", "es", "s"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 4:
            word = word[: -len(suffix)]
            break
    if word.endswith("e") and len(word) >= 5:  # merge/merged, change/changes
        word = word[:-1]
    return word[:6]


def content_words(text: str) -> Counter:
    """Stemmed content words with counts: what a TF-IDF cosine compares. URLs, paths and file names are left
    out: they are the artifacts signal, and counting their words here too would let artifacts alone pass for
    a paraphrase."""
    for rx in (_URL, _PATH, _FILE):
        text = rx.sub(" ", text)
    return Counter(stem(w) for w in _WORD.findall(text.lower()) if w not in STOP_WORDS)


def _normalize(data: bytes) -> bytes:
    return b"\n".join(line.strip() for line in data.splitlines() if line.strip())


def file_fingerprints(folder: Path) -> dict[str, str]:
    """sha1 of each whitespace-normalized file under tests/, solution/, environment/ -> its relative path."""
    out: dict[str, str] = {}
    for sub in FILE_DIRS:
        base = folder / sub
        if not base.is_dir():
            continue
        for p in sorted(base.rglob("*")):
            try:
                if not p.is_file() or p.stat().st_size > MAX_FILE_BYTES:
                    continue
                data = _normalize(p.read_bytes())
            except OSError:
                continue
            if len(data) >= MIN_FILE_BYTES:
                out.setdefault(hashlib.sha1(data).hexdigest(), p.relative_to(folder).as_posix())
    return out


def docker_images(folder: Path) -> set[str]:
    """The images a task builds on (`[environment] docker_image`, Dockerfile FROM), without their tags."""
    names: set[str] = set()
    toml = folder / "task.toml"
    if toml.is_file():  # a line match, not a TOML parse: this runs on every task of a corpus
        try:
            names.update(_IMAGE.findall(toml.read_text(errors="replace")))
        except OSError:
            pass
    for dockerfile in (folder / "environment" / "Dockerfile", folder / "Dockerfile"):
        if dockerfile.is_file():
            try:
                text = dockerfile.read_text(errors="replace")
            except OSError:
                continue
            names.update(re.findall(r"(?im)^\s*FROM\s+(?:--\S+\s+)*(\S+)", text))
    return {"image:" + re.sub(r"(@sha256:\w+|:[\w.\-]+)$", "", n.lower()) for n in names}
