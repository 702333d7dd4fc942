"""Checks for fix-inventory: each bug is tested on its own so partial fixes show."""

import csv
import subprocess
from pathlib import Path

APP = Path("/app")


def items() -> list[dict]:
    with open("/tests/stock_original.csv", newline="") as f:
        return list(csv.DictReader(f))


def report_lines() -> list[str]:
    proc = subprocess.run(
        ["python3", str(APP / "inventory.py"), str(APP / "stock.csv")],
        capture_output=True, text=True, timeout=30, check=True,
    )
    return proc.stdout.strip().splitlines()


def test_stock_unchanged():
    assert (APP / "stock.csv").read_text() == Path("/tests/stock_original.csv").read_text()


def test_sorted_by_name():
    names = [line.split(":")[0] for line in report_lines()[:-1]]
    assert names == sorted(row["name"] for row in items())


def test_low_stock_flags():
    flagged = {line.split(":")[0] for line in report_lines()[:-1] if line.endswith(" LOW")}
    assert flagged == {row["name"] for row in items() if int(row["qty"]) < 5}


def test_total_value():
    total = sum(int(row["qty"]) * float(row["price"]) for row in items())
    assert report_lines()[-1] == f"TOTAL: {total:.2f}"


def test_report_saved():
    assert (APP / "report.txt").read_text().strip().splitlines() == report_lines()
