"""Checks for rotate-backups: keep/move/list are separate tests, plus a no-data-loss check."""

from pathlib import Path

APP = Path("/app")
ALL = sorted(
    f"db-{d}.tar.gz" for d in ["2024-03-09", "2024-03-12", "2024-03-10", "2024-02-28", "2024-03-11", "2024-03-01"]
)


def names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


def test_no_dump_lost():
    assert sorted(names(APP / "backups") + names(APP / "archive")) == ALL
    for name in ALL:
        path = APP / "backups" / name
        if not path.exists():
            path = APP / "archive" / name
        assert path.read_text() == f"dump {name[3:13]}\n"


def test_three_newest_kept():
    assert names(APP / "backups") == ALL[-3:]


def test_older_archived():
    assert names(APP / "archive") == ALL[:-3]


def test_kept_list():
    assert (APP / "kept.txt").read_text().split() == ALL[-3:]
