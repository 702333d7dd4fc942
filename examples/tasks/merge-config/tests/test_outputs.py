"""Checks for merge-config: one test per merge rule, so partial merges show."""

import configparser
import os
from pathlib import Path

import pytest

APP = Path("/app")
TESTS = Path(os.environ.get("TEST_DIR", "/tests"))


def read(path: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser()
    assert parser.read(path), f"cannot read {path}"
    return parser


@pytest.fixture
def merged() -> configparser.ConfigParser:
    return read(APP / "merged.ini")


def test_inputs_unchanged():
    assert (APP / "defaults.ini").read_text() == (TESTS / "defaults_original.ini").read_text()
    assert (APP / "overrides.ini").read_text() == (TESTS / "overrides_original.ini").read_text()


def test_all_sections_present(merged):
    want = set(read(TESTS / "defaults_original.ini").sections()) | set(read(TESTS / "overrides_original.ini").sections())
    assert set(merged.sections()) == want


def test_overrides_win(merged):
    overrides = read(TESTS / "overrides_original.ini")
    for section in overrides.sections():
        for key, value in overrides[section].items():
            if (section, key) != ("server", "port"):
                assert merged[section][key] == value, (section, key)


def test_defaults_kept(merged):
    defaults, overrides = read(TESTS / "defaults_original.ini"), read(TESTS / "overrides_original.ini")
    for section in defaults.sections():
        for key, value in defaults[section].items():
            if (section, key) != ("server", "port") and not overrides.has_option(section, key):
                assert merged[section][key] == value, (section, key)


def test_port_from_environment(merged):
    assert merged["server"]["port"] == os.environ["APP_PORT"]
