"""`sandbox.network = "task"`: a sandbox granted the network reaches the package registries and nothing else.

No traffic leaves this machine: the "registry" is an HTTP server on 127.0.0.1 that the test names as the only
allowed registry (CONCH_NETWORK_ALLOW=localhost:PORT); addresses outside the list are refused by the proxy
(403) before any connection is made.
"""

from __future__ import annotations

import asyncio
import http.server
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from conch.sandbox import SandboxSpec, make_sandbox
from conch.sandbox.network import _target, granted, is_allowed

REPO = Path(__file__).resolve().parents[1]


def test_policy_and_allow_list(monkeypatch):
    assert granted("task", True) and not granted("task", False) and not granted("never", True)
    with pytest.raises(ValueError, match="never, task"):
        granted("always", True)
    assert is_allowed("pypi.org", 443) and is_allowed("files.pythonhosted.org", 443)
    assert not is_allowed("pypi.org", 22) and not is_allowed("169.254.169.254", 80) and not is_allowed("evil.org", 443)
    monkeypatch.setenv("CONCH_NETWORK_ALLOW", "mirror.internal:8080")
    assert is_allowed("mirror.internal", 8080) and not is_allowed("pypi.org", 443)
    assert _target("CONNECT pypi.org:443 HTTP/1.1") == ("CONNECT", "pypi.org", 443, True)
    assert _target("GET http://deb.debian.org/debian/dists/trixie/Release HTTP/1.1") == (
        "GET", "deb.debian.org", 80, False)
    assert _target("GET /relative HTTP/1.1") is None


@pytest.fixture
def registry(monkeypatch):
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"registry-ok\n")

        def log_message(self, *args):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    port = srv.server_address[1]
    monkeypatch.setenv("CONCH_NETWORK_ALLOW", f"localhost:{port}")
    yield port
    srv.shutdown()



def test_registries_only(backend, registry):
    async def run(registries: bool) -> list[str]:
        sb = make_sandbox(backend, SandboxSpec(name="net"), registries=registries)
        await sb.start()
        try:
            out = []
            for cmd in (f"curl -s --max-time 20 http://localhost:{registry}/simple/",
                        f"curl -s --max-time 20 -o /dev/null -w '%{{http_code}}' http://127.0.0.1:{registry}/",
                        "curl -s --max-time 20 -o /dev/null https://example.org/; echo rc=$?"):
                r = await sb.exec(cmd, timeout=60)
                out.append(r.stdout.strip())
            return out
        finally:
            await sb.stop()

    allowed, other_address, tls_elsewhere = asyncio.run(run(True))
    assert allowed == "registry-ok"
    assert other_address == "403"  # the same server under a name that is not a registry: refused
    assert tls_elsewhere == "rc=56"  # CONNECT refused by the proxy
    offline = asyncio.run(run(False))
    assert offline[0] == "" and offline[1] == "000"  # never: no network at all


def test_check_network_task_grants_allow_internet_tasks_registries_only(base_root, registry):
    task = REPO / "tests" / "fixtures" / "tb2-tasks" / "multistage-greet"  # sets allow_internet = true
    proc = subprocess.run([sys.executable, "-m", "conch", "check", str(task), "--network", "task", "--no-nop",
                           "--json"], capture_output=True, text=True, cwd=REPO, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (r,) = json.loads(proc.stdout)
    assert any("could reach the package registries only" in w for w in r["warnings"])
    # granted, uvx resolves against the index; this test's only "registry" is the loopback server, so PyPI is
    # refused by the proxy, and that is an error naming the index, never a 0
    assert r["reward"] is None and "pypi.org" in r["error"], r["error"]
