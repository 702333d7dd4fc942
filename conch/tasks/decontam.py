"""Decontamination: is any task of a corpus a near-copy of a benchmark task?

Why three signals:
- word n-gram containment (8- and 13-grams) catches copied passages, even when they are a small part of a
  longer text (we divide the shared n-grams by the smaller of the two n-gram sets) — and it is exact: an
  inverted index over the reference n-grams scores every task against every reference in one pass;
- a fuzzy ratio (rapidfuzz's normalized indel similarity over word sequences) catches light rewording, which
  breaks many n-grams but keeps the word order;
- MinHash/LSH (datasketch) keeps the fuzzy ratio, the only pairwise step, affordable: it runs only on the
  references an LSH forest returns as nearest by word-3-gram Jaccard, plus any reference sharing an n-gram.

A task's text is its instruction; its test files are compared too, by the share of a reference instruction's
n-grams they contain (a test that quotes a benchmark instruction is contamination as well).

score = max(containment8, containment13, tests containment8/13, fuzzy), in [0, 1]; a task is flagged when
score >= threshold. DEFAULT_THRESHOLD = 0.5: half of one text's 8-grams inside the other, or a word-level
edit similarity of 0.5, is far above what unrelated task descriptions share (our 2,000-task corpus peaks
well below it against Terminal-Bench 2), while a reference with a few words changed scores above 0.8.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

DEFAULT_THRESHOLD = 0.5
NGRAM_SIZES = (8, 13)
SHINGLE = 3  # word shingles for MinHash
NUM_PERM = 64
FOREST_K = 5
TEST_SUFFIXES = (".py", ".sh", ".txt", ".md", ".json", ".yaml", ".yml")
_TOKEN = re.compile(r"[a-z0-9]+")


def tokenize(text: str) -> list[str]:
    """Lowercased alphanumeric words: punctuation, markdown and whitespace differences do not matter."""
    return _TOKEN.findall(text.lower())


def ngrams(tokens: list[str], n: int) -> set[int]:
    return {hash(tuple(tokens[i : i + n])) for i in range(len(tokens) - n + 1)}


@dataclass
class Doc:
    """A task or reference reduced to what decontamination compares."""

    name: str
    path: Path
    tokens: list[str]
    test_tokens: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Match:
    task: str
    path: Path
    nearest: str | None
    score: float
    flagged: bool
    detail: dict[str, float]

    def to_json(self) -> dict:
        return {"task": self.task, "nearest": self.nearest, "score": round(self.score, 4), "flagged": self.flagged}


def _tb1_instruction(path: Path) -> str | None:
    try:
        import yaml

        doc = yaml.safe_load(path.read_text(errors="replace"))
    except Exception:
        return None
    if isinstance(doc, dict) and isinstance(doc.get("instruction"), str):
        return doc["instruction"]
    if isinstance(doc, dict) and isinstance(doc.get("descriptions"), list):  # early TB1 layout
        return "\n".join(d.get("description", "") for d in doc["descriptions"] if isinstance(d, dict))
    return None


def _name(folder: Path, root: Path) -> str:
    rel = folder.relative_to(root).as_posix() if folder != root else folder.name
    return rel or folder.name


def find_instructions(root: Path) -> Iterable[tuple[str, Path, str]]:
    """(name, folder, instruction text) for every task below `root`, valid or not.

    Accepts Harbor folders (`instruction.md`), TB1 folders (`task.yaml` with `instruction`), and bare
    `instruction.md` files anywhere; the name is the folder path relative to `root`. Hidden folders are skipped.
    """
    root = Path(root)
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: not a directory")
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        folder = Path(dirpath)
        if "instruction.md" in filenames:
            text: str | None = (folder / "instruction.md").read_text(errors="replace")
        elif "task.yaml" in filenames or "task.yml" in filenames:
            text = _tb1_instruction(folder / ("task.yaml" if "task.yaml" in filenames else "task.yml"))
        else:
            continue
        dirnames.clear()  # a task folder's own subfolders are not tasks
        if text is not None:
            yield _name(folder, root), folder, text


def _test_text(folder: Path) -> str:
    tests = folder / "tests"
    if not tests.is_dir():
        return ""
    parts = []
    for p in sorted(tests.rglob("*")):
        if p.is_file() and p.suffix in TEST_SUFFIXES and p.stat().st_size < 2_000_000:
            parts.append(p.read_text(errors="replace"))
    return "\n".join(parts)


def load_docs(root: Path, with_tests: bool) -> list[Doc]:
    return [Doc(name, folder, tokenize(text), tokenize(_test_text(folder)) if with_tests else [])
            for name, folder, text in find_instructions(root)]


class Reference:
    """The reference side, indexed once: n-gram inverted indexes, an LSH forest, word-id strings."""

    def __init__(self, docs: list[Doc]):
        from datasketch import MinHashLSHForest

        self.docs = docs
        self.sizes = {n: [0] * len(docs) for n in NGRAM_SIZES}
        self.index: dict[int, dict[int, list[int]]] = {n: {} for n in NGRAM_SIZES}
        for i, d in enumerate(docs):
            for n in NGRAM_SIZES:
                grams = ngrams(d.tokens, n)
                self.sizes[n][i] = len(grams)
                for g in grams:
                    self.index[n].setdefault(g, []).append(i)
        self.vocab: dict[str, str] = {}
        self.strings = [self.encode(d.tokens) for d in docs]
        self.forest = MinHashLSHForest(num_perm=NUM_PERM)
        for i, mh in enumerate(minhashes([d.tokens for d in docs])):
            self.forest.add(i, mh)
        self.forest.index()

    def encode(self, tokens: list[str]) -> str:
        """One character per word, so rapidfuzz compares word sequences (fast C++ on short strings)."""
        out = []
        for t in tokens:
            ch = self.vocab.get(t)
            if ch is None:
                ch = self.vocab[t] = chr(0x10000 + len(self.vocab))
            out.append(ch)
        return "".join(out)

    def hits(self, tokens: list[str], n: int) -> Counter:
        counts: Counter = Counter()
        index = self.index[n]
        for g in ngrams(tokens, n):
            for i in index.get(g, ()):
                counts[i] += 1
        return counts


def _hash32(s: str) -> int:
    return hash(s) & 0xFFFFFFFF


def minhashes(token_lists: list[list[str]]):
    from datasketch import MinHash

    sets = [{" ".join(t[i : i + SHINGLE]) for i in range(max(1, len(t) - SHINGLE + 1))} for t in token_lists]
    return MinHash.bulk([sorted(s) for s in sets], num_perm=NUM_PERM, hashfunc=_hash32)


def score_docs(tasks: list[Doc], ref: Reference, threshold: float = DEFAULT_THRESHOLD) -> list[Match]:
    from rapidfuzz.distance import Indel

    out = []
    task_hashes = minhashes([t.tokens for t in tasks])
    for task, mh in zip(tasks, task_hashes):
        own = {n: len(ngrams(task.tokens, n)) for n in NGRAM_SIZES}
        parts: dict[int, dict[str, float]] = {}

        def part(i: int) -> dict[str, float]:
            return parts.setdefault(i, {})

        for n in NGRAM_SIZES:
            for i, h in ref.hits(task.tokens, n).items():
                part(i)[f"c{n}"] = h / max(1, min(own[n], ref.sizes[n][i]))
            if task.test_tokens:
                for i, h in ref.hits(task.test_tokens, n).items():
                    part(i)[f"tests{n}"] = h / max(1, ref.sizes[n][i])
        for i in ref.forest.query(mh, FOREST_K) if ref.docs else []:
            part(i)
        encoded = ref.encode(task.tokens)
        if not parts and ref.docs:  # nothing shared and no LSH neighbour: fall back to the best fuzzy match
            from rapidfuzz import process

            hit = process.extractOne(encoded, ref.strings, scorer=Indel.normalized_similarity)
            part(hit[2])
        best_i, best, best_detail = None, -1.0, {}
        for i, d in parts.items():
            d["fuzzy"] = Indel.normalized_similarity(encoded, ref.strings[i])
            s = max(d.values())
            if s > best or (s == best and best_i is not None and ref.docs[i].name < ref.docs[best_i].name):
                best_i, best, best_detail = i, s, d
        best = max(best, 0.0)
        nearest = ref.docs[best_i].name if best_i is not None else None
        out.append(Match(task.name, task.path, nearest, best, best >= threshold,
                         {k: round(v, 4) for k, v in sorted(best_detail.items())}))
    return out


def decontaminate(tasks_dir: Path, against: Path, threshold: float = DEFAULT_THRESHOLD) -> list[Match]:
    """Score every task under `tasks_dir` against every reference under `against`."""
    refs = load_docs(against, with_tests=False)
    if not refs:
        raise ValueError(f"{against}: no reference instructions found (instruction.md or task.yaml)")
    tasks = load_docs(tasks_dir, with_tests=True)
    return score_docs(tasks, Reference(refs), threshold)
