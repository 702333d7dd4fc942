"""Checks for log-levels: the header and each level's count are separate tests."""

import csv
from collections import Counter
from pathlib import Path

import pytest

SUMMARY = Path("/app/out/summary.csv")
LEVELS = ["ERROR", "WARNING", "INFO", "DEBUG"]


def expected() -> Counter:
    lines = Path("/tests/app_original.log").read_text().splitlines()
    return Counter(line.split()[1] for line in lines if line.strip())


def rows() -> list[list[str]]:
    with SUMMARY.open(newline="") as f:
        return [row for row in csv.reader(f) if row]


def test_header_and_order():
    assert [r[0] for r in rows()] == ["level"] + LEVELS
    assert rows()[0] == ["level", "count"]


@pytest.mark.parametrize("level", LEVELS)
def test_level_count(level):
    counts = {r[0]: r[1] for r in rows()[1:]}
    assert counts.get(level) == str(expected()[level])
