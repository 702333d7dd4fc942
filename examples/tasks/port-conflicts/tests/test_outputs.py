from pathlib import Path

import pytest

CONF = Path("/app/services.conf")
OUT = Path("/app/conflicts.txt")
EXPECTED = {6379: "cache, replica", 8080: "web, admin, sidecar", 9100: "metrics, exporter"}


def test_config_unchanged():
    names = [line.split()[0] for line in CONF.read_text().splitlines() if line.strip() and not line.startswith("#")]
    assert names == ["web", "metrics", "admin", "cache", "queue", "search", "exporter", "sidecar", "replica"]


def test_one_line_per_conflicting_port_in_order():
    ports = [int(line.split(":")[0]) for line in OUT.read_text().splitlines() if line.strip()]
    assert ports == sorted(EXPECTED)


@pytest.mark.parametrize("port", sorted(EXPECTED))
def test_port_lists_its_services_in_file_order(port):
    lines = {line.split(":")[0]: line for line in OUT.read_text().splitlines() if line.strip()}
    assert lines[str(port)] == f"{port}: {EXPECTED[port]}"
