"""The `local` backend's verifier box: a fresh box over the agent's mounted root, with the toolchain pristine.

Why a second box rather than running the tests in the agent's: a process the agent left running (a `setsid`
daemon, a `nohup` loop) could rewrite the results while the tests run, or the tests while they arrive; and a
mid-episode measurement (`reward.mode = "progress"`) would show the agent the tests. So:

1. the agent's box is frozen (cgroup freezer): nothing of it runs, forks or writes from here on;
2. a verifier box is launched *inside the agent box's outer mount namespace* (where its overlay root is
   mounted), over a second overlay whose only lower layer is that root and whose upper is a fresh tmpfs: the
   verifier sees exactly the agent's final filesystem and nothing it writes reaches it;
3. bubblewrap then binds the verifier's toolchain from the image's own layers over it (`verifier_view.plan`),
   and conch's host folders at /tests (read-only), /logs/verifier, /var/log/conch and VERIFIER_RUN;
4. once that box is up, a final verification kills the agent's box (its pid namespace, every process); a
   mid-episode one leaves it frozen until the verifier box is gone, then thaws it.

The verifier box has its own pid namespace and cgroups (same limits), its own pid 1, and is stopped (every
process killed) before conch reads the results, which it reads on the host from the bound folders.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import secrets
from pathlib import Path
from typing import AsyncIterator

from conch.sandbox import paths
from conch.sandbox.base import VERIFIER_RUN, SandboxError, VerifierSetup
from conch.sandbox.bwrap import BoxConfig, Cgroups, shift_tree
from conch.sandbox.readback import DOWNLOAD_CAP, copy_out
from conch.sandbox.local import LocalSandbox
from conch.sandbox.verifier_view import Change, HostTree, LayersTree, Memo, path_dirs, plan

# conch's folders in the verifier box, in bind order (after the toolchain's): (setup field, mode, box path).
# Results land on tmpfs (RAM, capped, charged to the verifier box's memory limit), never on a host folder.
MOUNTS = (("tests", "ro", "/tests"), ("run", "ro", VERIFIER_RUN), ("", "tmpfs", f"{VERIFIER_RUN}/uv-cache"),
          ("", "tmpfs", "/logs/verifier"), ("", "tmpfs", "/var/log/conch"))
COLLECT = (("logs", "logs/verifier"), ("warnings", "var/log/conch"))  # (setup field, box path) copied out
UV_CACHE = "root/.cache/uv"  # where the base root's build left uv's cache, warm with the verifier's wheels
VERIFY_TMPFS_MB = 4096  # the verifier's writable layer


@functools.lru_cache(maxsize=32)
def pristine_tree(lowers: tuple[Path, ...]) -> Memo:
    """The image's layers as one read-only view, memoized (layers never change once built)."""
    return Memo(LayersTree(list(lowers)))


def _binds(changes: list[Change], setup: VerifierSetup, pristine: Memo) -> tuple[tuple[str, str, str], ...]:
    out = [(c.kind, c.source if c.kind == "pristine" else c.path, "/" + c.path) for c in changes]
    for field, mode, box in MOUNTS:
        if box == f"{VERIFIER_RUN}/uv-cache" and pristine.kind(UV_CACHE) == "dir":
            out.append(("cow", UV_CACHE, box))  # the image's warm uv cache, copy-on-write: uvx starts fast
        else:
            out.append((mode, str(getattr(setup, field)) if field else str(DOWNLOAD_CAP + (1 << 20)), box))
    return tuple(out)


def _mount_points(changes: list[Change]) -> dict[str, tuple[str, ...]]:
    """Every mount point made real in the verifier's upper layer before bubblewrap mounts on it: a link the
    agent left on the way (or at the end) would otherwise lead the mount somewhere else."""
    dirs = {box.lstrip("/") for _, _, box in MOUNTS}
    files = set()
    for c in changes:
        parts = c.path.split("/")
        dirs.update("/".join(parts[:i]) for i in range(1, len(parts)))
        (dirs if c.folder else files).add(c.path)
    return {"upper_dirs": tuple(sorted(dirs)), "upper_files": tuple(sorted(files - dirs))}


def _own(setup: VerifierSetup) -> None:
    """Give box root (host uid ID_BASE) the staged read-only folders."""
    shift_tree(setup.tests)
    shift_tree(setup.run)


class VerifierBox(LocalSandbox):
    """A box over `agent`'s mounted root (see the module docstring). Started by `verifier_box` only."""

    def __init__(self, agent: LocalSandbox) -> None:
        super().__init__(agent.spec)
        self.name = f"{agent.name}-verifier"
        self.agent = agent

    async def start(self) -> None:  # noqa: D102 - see `open`
        raise SandboxError("a verifier box is opened with conch.sandbox.local_verify.verifier_box")

    async def open(self, setup: VerifierSetup) -> None:
        agent = self.agent
        launcher = agent.launcher_pid
        if launcher is None or agent.state_dir is None or agent.image is None:
            raise SandboxError(f"sandbox {agent.name!r} is not running; nothing to verify")
        self.image = agent.image
        agent_root = HostTree(f"/proc/{launcher}/root{agent.state_dir}/merged")
        pristine = pristine_tree(tuple(agent.image.lowers))
        changes = await asyncio.to_thread(plan, pristine, agent_root, path_dirs(agent.env.get("PATH")))
        await asyncio.to_thread(_own, setup)
        sid = f"{agent.state_dir.name}-v{secrets.token_hex(2)}"
        state = paths.sandboxes_dir() / sid
        (state / "rw").mkdir(parents=True)
        (state / "merged").mkdir()
        self.state_dir = state
        try:
            self._cgroups = Cgroups(sid)
            self._cgroups.create(agent.spec.limits)
            self._write_owner({})
            cfg = BoxConfig(state_dir=state, lowers=(agent.state_dir / "merged",),
                            tmpfs_mb=min(VERIFY_TMPFS_MB, max(256, agent.spec.limits.storage_mb)),
                            hostname=agent.env.get("HOSTNAME", "sandbox"), cgroup_views=self._cgroups.views(),
                            mount_ns=f"/proc/{launcher}/ns/mnt", pristine=tuple(agent.image.lowers),
                            binds=_binds(changes, setup, pristine),
                            **_mount_points(changes))
            await self._launch(cfg)
        except BaseException:
            await self.stop()
            raise
        self._env = agent.env
        self._cwd = agent.cwd

    async def collect(self, setup: VerifierSetup) -> None:
        """Stop the verifier box's processes where they stand, then copy its results folders to `setup`'s."""
        await self.freeze()
        for field, rel in COLLECT:
            await asyncio.to_thread(copy_out, f"/proc/{self.init_pid}/root/{rel}", Path(getattr(setup, field)))


@contextlib.asynccontextmanager
async def verifier_box(agent: LocalSandbox, setup: VerifierSetup) -> AsyncIterator[LocalSandbox]:
    """Freeze `agent`, open a verifier box over its filesystem, kill (final) or later thaw the agent."""
    await agent.freeze()
    box = VerifierBox(agent)
    try:
        await box.open(setup)
        if setup.final:
            await agent.kill_processes()
        yield box
        await box.collect(setup)
    finally:
        await box.stop()
        if not setup.final:
            await agent.thaw()
