"""Decontamination: is any task of a corpus a near-copy, or a paraphrase, of a benchmark task?

Two kinds of contamination, two families of signals:

Copies (the text itself was taken):
- word n-gram containment (8- and 13-grams) catches copied passages, even when they are a small part of a
  longer text (we divide the shared n-grams by the smaller of the two n-gram sets) — and it is exact: an
  inverted index over the reference n-grams scores every task against every reference in one pass;
- a fuzzy ratio (rapidfuzz's normalized indel similarity over word sequences) catches light rewording, which
  breaks many n-grams but keeps the word order;
- MinHash/LSH (datasketch) keeps the fuzzy ratio, the only pairwise step, affordable: it runs only on the
  references an LSH forest returns as nearest by word-3-gram Jaccard, plus any reference sharing an n-gram
  or ranking high on the signals below.
- a task's test files are compared too, by the share of a reference instruction's n-grams they contain.

Paraphrases (the task was taken, the words were not): a rewording shares few n-grams and scores 0.2-0.5 on
the fuzzy ratio, yet it keeps what the task *is* (conch/tasks/artifacts.py):
- `artifacts`: the IDF- and specificity-weighted share of the reference's concrete artifacts (paths, file
  names, URLs, versions, identifiers, quoted output strings, formats, its Docker image) found anywhere in the
  task (instruction, tests, solution, Dockerfile, task.toml);
- `similarity`: TF-IDF cosine of stemmed content words, order-free;
- `paraphrase` = sqrt(artifacts x similarity): both must be high. Either alone is weak: unrelated tasks share
  generic artifacts (`/app/output.txt`, a port) or a topic (git, logs), rarely both with one reference;
- `files`: the share of the reference's own test/solution/environment files (where the reference has them)
  found byte-identical (whitespace-normalized) in the task; files that several references share (a standard
  test.sh) are no evidence.

score = max(containment8/13, tests containment, fuzzy, paraphrase, files), in [0, 1]; a task is flagged when
score >= threshold. DEFAULT_THRESHOLD = 0.5. Measured (docs/decontam.md): 38 paraphrases of Terminal-Bench 2
tasks written for tests/data/decontam score 0.57-0.88 (the copy signals alone: 0.09-0.69, 3 flagged), nearest
reference right in every case; 2,000 synthesized tasks, examples/tasks and same-topic different tasks peak at
0.34. A task's `why` says which signal decided and which artifacts and files it shares with the reference.
"""

from __future__ import annotations

import math
import os
import re
import zlib
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from conch.tasks.artifacts import candidate_keys, content_words, docker_images, extract_artifacts, file_fingerprints

DEFAULT_THRESHOLD = 0.5
NGRAM_SIZES = (8, 13)
SHINGLE = 3  # word shingles for MinHash
NUM_PERM = 64
FOREST_K = 5
FUZZY_TOP = 5  # references ranked highest by paraphrase and by similarity also get the (pairwise) fuzzy ratio
# The artifact share's denominator is at least this much weight (about one and a half artifacts that only one
# reference has): a reference that names one or two concrete things cannot be matched by those alone.
ART_FLOOR = 6.0
WHY_ARTIFACTS = 10  # shared artifacts listed in `why`
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
    words: Counter = field(default_factory=Counter)
    artifacts: dict[str, float] = field(default_factory=dict)
    files: dict[str, str] = field(default_factory=dict)  # content hash -> relative path
    all_tokens: list[str] = field(default_factory=list)  # instruction, tests, solution: where phrases are sought
    bonus: frozenset[str] = frozenset()  # artifacts that count when shared but not in the reference's total


@dataclass(frozen=True)
class Match:
    task: str
    path: Path
    nearest: str | None
    score: float
    flagged: bool
    detail: dict[str, float]
    why: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"task": self.task, "nearest": self.nearest, "score": round(self.score, 4), "flagged": self.flagged,
                "why": self.why}


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


def _folder_text(folder: Path, subdirs: tuple[str, ...]) -> str:
    parts = []
    for sub in subdirs:
        base = folder / sub
        if not base.is_dir():
            continue
        for p in sorted(base.rglob("*")):
            try:
                if p.is_file() and p.suffix in TEST_SUFFIXES and p.stat().st_size < 2_000_000:
                    parts.append(p.read_text(errors="replace"))
            except OSError:  # an unreadable file must not stop the batch; it just adds no text
                continue
    return "\n".join(parts)


def _test_text(folder: Path) -> str:
    return _folder_text(folder, ("tests",))


def make_doc(name: str, folder: Path, text: str, reference: bool, with_files: bool = True) -> Doc:
    """Reduce one task folder: instruction tokens, test tokens, content words, artifacts, file fingerprints.

    Artifacts come from everything a paraphrase would keep: the instruction, tests, solution, the task.toml
    image and the Dockerfile's base image. A reference gets weighted artifacts (`extract_artifacts`); a task
    only the cheap superset of keys that could equal one (`candidate_keys`), since only shared keys count.
    """
    tests = _test_text(folder)
    solution = _folder_text(folder, ("solution",))
    extra = tests + "\n" + solution
    images = docker_images(folder)
    if reference:
        artifacts = extract_artifacts(text)
        bonus = frozenset(images | (extract_artifacts(extra).keys() - artifacts.keys()))
        for key, weight in extract_artifacts(extra).items():
            artifacts[key] = max(weight, artifacts.get(key, 0.0))
    else:
        artifacts, bonus = dict.fromkeys(candidate_keys(text + "\n" + extra), 1.0), frozenset()
    artifacts.update(dict.fromkeys(images, 1.0))
    tokens, test_tokens = tokenize(text), [] if reference else tokenize(tests)
    return Doc(name, folder, tokens, test_tokens, content_words(text), artifacts,
               file_fingerprints(folder) if with_files else {},
               [] if reference else [*tokens, "", *test_tokens, "", *tokenize(solution)], bonus)


def load_docs(root: Path, reference: bool, with_files: bool = True) -> list[Doc]:
    """Every task under `root`, reduced; `with_files=False` skips fingerprinting (no reference has files)."""
    return [make_doc(name, folder, text, reference, with_files) for name, folder, text in find_instructions(root)]


class Reference:
    """The reference side, indexed once: n-gram inverted indexes, an LSH forest, word-id strings, and for
    paraphrases TF-IDF word vectors, weighted artifacts and specific files, each behind an inverted index."""

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
        self._index_paraphrase_signals()

    def _index_paraphrase_signals(self) -> None:
        n = len(self.docs)
        word_df = Counter(w for d in self.docs for w in d.words)
        self.word_idf = {w: math.log((n + 1) / (df + 0.5)) for w, df in word_df.items()}
        self.word_row = {w: k for k, w in enumerate(word_df)}
        self.word_matrix = np.zeros((len(word_df), n))  # word x reference, columns are unit TF-IDF vectors
        for i, d in enumerate(self.docs):
            for w, x in self.vector(d.words).items():
                self.word_matrix[self.word_row[w], i] = x
        art_df = Counter(a for d in self.docs for a in d.artifacts)
        # An artifact's weight: its specificity times its rarity among the references (IDF). A phrase (a key
        # with a space) is sought as a word sequence. The image and what only the reference's tests and solution
        # name are a bonus, not in the total: a paraphrase restates the instruction and must not lose for what
        # it never saw. An image several references use is no evidence.
        self.art_index: dict[str, list[tuple[int, float]]] = {}
        self.phrases: list[tuple[str, str, str, int, float]] = []  # (first word, " words ", key, ref, weight)
        self.art_total = np.zeros(n)
        for i, d in enumerate(self.docs):
            for a, spec in d.artifacts.items():
                w = spec * math.log((n + 1) / (art_df[a] + 0.5))
                words = tuple(tokenize(a)) if " " in a else ()
                if len(words) >= 2:
                    self.phrases.append((words[0], f" {' '.join(words)} ", a, i, w))
                elif not (a.startswith("image:") and art_df[a] > 1):
                    self.art_index.setdefault(a, []).append((i, w))
                if a not in d.bonus:
                    self.art_total[i] += w
        self.art_denominator = np.maximum(self.art_total, ART_FLOOR)
        file_df = Counter(h for d in self.docs for h in d.files)
        self.file_index = {h: i for i, d in enumerate(self.docs) for h in d.files if file_df[h] == 1}
        self.file_total = Counter(self.file_index.values())

    def vector(self, words: Counter) -> dict[str, float]:
        """Unit-length TF-IDF vector; words no reference uses are dropped (they cannot be shared)."""
        v = {w: (1.0 + math.log(c)) * self.word_idf[w] for w, c in words.items() if w in self.word_idf}
        norm = math.sqrt(sum(x * x for x in v.values())) or 1.0
        return {w: x / norm for w, x in v.items()}

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

    def paraphrase_signals(self, task: Doc, shared: dict[int, dict[str, float]]):
        """(similarity, artifacts, paraphrase) arrays over the references, and {reference: files share};
        `shared` is `shared_artifacts(task)`."""
        v = self.vector(task.words)
        rows = [self.word_row[w] for w in v]
        sim = np.clip(np.fromiter(v.values(), float, len(v)) @ self.word_matrix[rows], 0.0, 1.0) if v \
            else np.zeros(len(self.docs))
        art = np.zeros(len(self.docs))
        for i, weights in shared.items():
            art[i] = sum(weights.values())
        art = np.minimum(1.0, art / self.art_denominator)
        files = Counter(self.file_index[h] for h in task.files if h in self.file_index)
        return sim, art, np.sqrt(sim * art), {i: c / self.file_total[i] for i, c in files.items()}

    def shared_artifacts(self, task: Doc) -> dict[int, dict[str, float]]:
        """reference index -> {artifact: weight} of the reference artifacts found in the task."""
        shared: dict[int, dict[str, float]] = {}
        for a in task.artifacts:
            for i, w in self.art_index.get(a, ()):
                shared.setdefault(i, {})[a] = w
        present = set(task.all_tokens)
        joined = None
        for first, words, a, i, w in self.phrases:
            if first in present:
                joined = joined or f" {' '.join(task.all_tokens)} "
                if words in joined:
                    shared.setdefault(i, {})[a] = w
        return shared

    def why(self, task: Doc, i: int, detail: dict[str, float], weights: dict[str, float]) -> dict:
        """What the task shares with reference i: the deciding signal, the similarity, the shared artifacts
        (`weights`, heaviest first) and the reference's files found identical in the task."""
        shared = sorted(weights, key=lambda a: (-weights[a], a))
        ref_files = self.docs[i].files
        files = sorted({ref_files[h] for h in task.files if self.file_index.get(h) == i})
        deciding = {k: v for k, v in detail.items() if k not in ("similarity", "artifacts")}
        signal = max(deciding, key=lambda k: (deciding[k], k)) if deciding else None
        return {"signal": signal, "similarity": round(detail.get("similarity", 0.0), 4),
                "artifacts": shared[:WHY_ARTIFACTS], "n_shared_artifacts": len(shared), "files": files}


def _hash32(s: str) -> int:
    """Stable across runs (Python's str hash is salted per process): the same corpus gets the same LSH
    candidates, hence the same scores, every time."""
    return zlib.crc32(s.encode())


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
        shared = ref.shared_artifacts(task)
        sim, art, para, files = ref.paraphrase_signals(task, shared)
        # The best reference is among these: the top by paraphrase and by similarity, any with identical files,
        # n-gram or LSH hits.
        top = [i for signal in (para, sim) for i in np.argsort(-signal, kind="stable")[:FUZZY_TOP] if signal[i] > 0]
        parts: dict[int, dict[str, float]] = {}

        def part(i: int) -> dict[str, float]:
            i = int(i)
            if i not in parts:
                parts[i] = {"similarity": float(sim[i]), "artifacts": float(art[i]), "paraphrase": float(para[i])}
                if i in files:
                    parts[i]["files"] = files[i]
            return parts[i]

        for i in [*top, *files]:
            part(i)

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
        for i in parts:
            parts[i]["fuzzy"] = Indel.normalized_similarity(encoded, ref.strings[i])
        best_i, best = None, -1.0
        for i, d in parts.items():
            s = max(v for k, v in d.items() if k not in ("similarity", "artifacts"))
            if s > best or (s == best and best_i is not None and ref.docs[i].name < ref.docs[best_i].name):
                best_i, best = i, s
        best = max(best, 0.0)
        detail = {k: round(v, 4) for k, v in sorted(parts[best_i].items())} if best_i is not None else {}
        nearest = ref.docs[best_i].name if best_i is not None else None
        why = ref.why(task, best_i, detail, shared.get(best_i, {})) if best_i is not None else {}
        out.append(Match(task.name, task.path, nearest, best, best >= threshold, detail, why))
    return out


def decontaminate(tasks_dir: Path, against: Path, threshold: float = DEFAULT_THRESHOLD) -> list[Match]:
    """Score every task under `tasks_dir` against every reference under `against`."""
    refs = load_docs(against, reference=True)
    if not refs:
        raise ValueError(f"{against}: no reference instructions found (instruction.md or task.yaml)")
    ref = Reference(refs)
    tasks = load_docs(tasks_dir, reference=False, with_files=bool(ref.file_index))
    return score_docs(tasks, ref, threshold)
