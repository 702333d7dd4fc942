"""Checks for word-count: each requirement is its own test so partial work shows."""

import json
import re
from collections import Counter
from pathlib import Path

APP = Path("/app")


def expected_counts() -> Counter:
    text = Path("/tests/input_original.txt").read_text()
    return Counter(re.findall(r"[a-z]+", text.lower()))


def load_counts() -> dict:
    return json.loads((APP / "counts.json").read_text())


def test_input_unchanged():
    assert (APP / "input.txt").read_text() == Path("/tests/input_original.txt").read_text()


def test_counts_is_json_object():
    counts = load_counts()
    assert isinstance(counts, dict)
    assert all(isinstance(v, int) for v in counts.values())


def test_counts_keys_are_lowercase_words():
    counts = load_counts()
    assert counts, "counts.json is empty"
    assert all(re.fullmatch(r"[a-z]+", k) for k in counts)


def test_counts_match_text():
    assert load_counts() == dict(expected_counts())


def test_top_word():
    counts = expected_counts()
    best = min(counts, key=lambda w: (-counts[w], w))
    assert (APP / "top.txt").read_text().strip() == best
