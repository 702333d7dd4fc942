"""Namespace plumbing shared by the local backend, its Dockerfile builder and the base-root builder.

Why this shape (measured on bubblewrap 0.8.0, which has no --overlay option):
- Host root mounts the overlay (and, for a storage limit, a loop-mounted ext4 upper) inside a private mount
  namespace (`unshare -m`), so nothing is ever mounted in the host's namespace and everything unmounts by
  itself when the last process of the sandbox dies, even after a crash.
- A user namespace maps box ids 0..65535 to the unprivileged host ids ID_BASE..ID_BASE+65535: box root can
  chown to any box user (useradd, apt's `_apt`), but on the host it is a uid that owns nothing outside its
  own layers, so files of the host kernel (/sys, /proc/sys, cgroupfs: host root's) are "other" to it. The
  layers on disk are stored shifted (`shift_tree`), so box root owns its image. `conch-enter --new-userns`
  creates the namespace; we write the maps from the host (no newuidmap needed), then release the child through
  its stdin, and it becomes the namespace's root before it execs bwrap.
- bubblewrap then switches root to the merged overlay, unshares pid/net/ipc/uts/cgroup namespaces and keeps
  only Docker's default capabilities (no CAP_SYS_ADMIN: no remounts); commands entered later go through
  `conch-enter` (enter.c), which drops the same set. /sys is a read-only tmpfs holding only the cpu topology
  and the box's own cgroups, read-only: no view of other boxes, the host's devices or power controls.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from conch.sandbox.base import BOX_CAPS, Limits, SandboxError
from conch.sandbox.enter import enter_binary

ID_RANGE = 65536
# Host uid/gid of box root; box id n is host id ID_BASE + n. Far above any real account, below 2^31.
ID_BASE = 1 << 30
# Mount point (host) of the per-box tmpfs through which host root hands paths over to bwrap.
HANDOVER = "/run/conch-box"
# Read-only views of the host's /sys that programs in a box commonly read (CPU count and topology).
SYS_VIEWS = ("/sys/devices/system/cpu", "/sys/devices/system/node")
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_warned: set[str] = set()


def warn_once(key: str, message: str, kind: str = "warning") -> None:
    if key not in _warned:
        _warned.add(key)
        print(f"conch: {kind}: {message}", file=sys.stderr)


def require_host() -> None:
    """The local backend needs root (overlay, loop devices, uid maps, cgroups) and a few tools."""
    if os.geteuid() != 0:
        raise SandboxError("the local sandbox backend must run as root (it mounts overlays and sets uid maps); "
                           "run as root or use --sandbox docker")
    missing = [t for t in ("bwrap", "unshare", "nsenter", "mount") if shutil.which(t) is None]
    if missing:
        raise SandboxError(f"missing host tools for the local sandbox: {', '.join(missing)} "
                           "(install with: apt-get install bubblewrap util-linux mount)")


def check_mount_path(path: Path) -> str:
    text = str(path)
    if any(c in text for c in ",:\n"):
        raise SandboxError(f"path {text!r} cannot be used in overlay mount options (contains ',' or ':')")
    return text


def overlay_options(lowers: list[Path], upper: Path, work: Path, cwd: Path) -> str:
    """Overlay mount options. Lower paths are made relative to `cwd` (the mount runs there) so that long
    layer stacks still fit the kernel's one-page limit on the option string."""
    rel = [os.path.relpath(p, cwd) for p in lowers]
    for p in lowers:
        check_mount_path(p)
    opts = f"lowerdir={':'.join(rel)},upperdir={check_mount_path(upper)},workdir={check_mount_path(work)}"
    if len(opts) > 4000:
        raise SandboxError(f"too many image layers ({len(lowers)}) for one overlay mount")
    return opts


def sh_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


@dataclass(frozen=True)
class BoxConfig:
    """How one box's root is assembled and which namespaces it gets.

    root modes: `lowers` + `upper_dir`/`work_dir` (overlay, upper on the host disk: build steps), `lowers` +
    `disk_image` (overlay, upper on a loop-mounted ext4 of fixed size: runtime storage limit), `lowers` +
    `tmpfs_mb` (overlay, upper on a size-limited tmpfs: fallback without loop devices), or `bind_root`
    (a plain directory, writable: building the base root itself).

    `netns`: join this held network namespace (image builds: loopback plus the registry proxy, see
    `network.build_network`); None gives the box a fresh one with loopback only. `ro_binds` are host files
    bound read-only (a build's CA bundle); `box_files` are host files copied into the box's writable layer
    before it starts, so the box may change them and every byte counts against its disk limit (/etc/hosts).
    `cgroup_views`: (host cgroup dir, box path) of the box's own cgroups, shown read-only under /sys/fs/cgroup.

    A verifier box (conch/sandbox/local_verify.py) is launched inside the agent box's outer mount namespace
    (`mount_ns`), over an overlay whose one lower is the agent's mounted root; `pristine` are the image's layers
    (shown read-only at HANDOVER/pristine) and `binds` its (mode, source, box path) mounts: "pristine" (a path
    of the image), "agent" (a path of the box's own root, re-exposed under a pristine folder), "ro"/"rw" (a
    host folder or file), "tmpfs" (source: its size cap in bytes), "cow" (a
    writable copy-on-write view of the image's folder `source`), "mask-file"/"mask-dir" (empty, read-only).
    """

    state_dir: Path
    lowers: tuple[Path, ...] = ()
    upper_dir: Path | None = None
    work_dir: Path | None = None
    disk_image: Path | None = None
    tmpfs_mb: int | None = None
    bind_root: Path | None = None
    netns: str | None = None
    hostname: str = "sandbox"
    ro_binds: tuple[tuple[str, str], ...] = field(default_factory=tuple)  # (host file, box path)
    box_files: tuple[tuple[str, str], ...] = field(default_factory=tuple)  # (host file, box path)
    cgroup_views: tuple[tuple[str, str], ...] = field(default_factory=tuple)  # (host dir, box dir)
    mount_ns: str | None = None
    pristine: tuple[Path, ...] = ()
    binds: tuple[tuple[str, str, str], ...] = field(default_factory=tuple)  # (mode, source, box path)
    upper_dirs: tuple[str, ...] = ()  # real folders made in the upper first (they hide a link of a lower)
    upper_files: tuple[str, ...] = ()  # empty files made there likewise (mount points of file binds)


def launcher_argv(cfg: BoxConfig, box_argv: list[str], *, as_pid_1: bool, cwd: str = "/") -> list[str]:
    """argv for the host process: unshare -m, mounts, conch-enter --new-userns (waits for maps on stdin), bwrap."""
    steps = ["set -e"]
    if cfg.bind_root is not None:
        root = check_mount_path(cfg.bind_root)
    else:
        steps += _overlay_steps(cfg)
        root = str(cfg.state_dir / "merged")
    bw = ["bwrap", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try", "--die-with-parent",
          "--hostname", cfg.hostname, "--bind", f"{HANDOVER}/root", "/", "--proc", "/proc", "--dev", "/dev",
          "--perms", "1777", "--size", str(64 << 20), "--tmpfs", "/dev/shm", *_sys_args(cfg),
          "--cap-drop", "ALL", *[a for cap in BOX_CAPS for a in ("--cap-add", f"CAP_{cap}")], "--chdir", cwd]
    if cfg.netns is None:
        bw.append("--unshare-net")
    # bwrap runs as box root, an unprivileged host uid that cannot walk CONCH_HOME (under root's home): what it
    # binds from there is first bound here, by host root, under HANDOVER (a tmpfs in this private namespace).
    os.makedirs(HANDOVER, mode=0o755, exist_ok=True)
    steps += [f"mount -t tmpfs -o size=1m,mode=0755 conch-box {HANDOVER}",
              f"mkdir {HANDOVER}/root && mount --bind {sh_quote(root)} {HANDOVER}/root"]
    for i, (host, box) in enumerate(cfg.ro_binds):
        steps.append(f"touch {HANDOVER}/file{i} && mount --bind {sh_quote(host)} {HANDOVER}/file{i}")
        bw += ["--ro-bind", f"{HANDOVER}/file{i}", box]
    steps += _verifier_steps(cfg, bw)
    if as_pid_1:
        bw.append("--as-pid-1")
    bw.append("--")
    bw += box_argv
    steps.append(f"exec {sh_quote(enter_binary())} --new-userns -- " + " ".join(sh_quote(a) for a in bw))
    outer = ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", "\n".join(steps)]
    joins = ([f"--net={cfg.netns}"] if cfg.netns else []) + ([f"--mount={cfg.mount_ns}"] if cfg.mount_ns else [])
    return ["nsenter", *joins, "--", *outer] if joins else outer


def _verifier_steps(cfg: BoxConfig, bw: list[str]) -> list[str]:
    """Host-root shell lines that hand a verifier box's sources over, and their bwrap arguments (into `bw`)."""
    steps: list[str] = []
    if not cfg.binds:
        return steps
    if cfg.pristine:
        steps.append(f"mkdir {HANDOVER}/pristine")
        if len(cfg.pristine) == 1:
            steps.append(f"mount --bind -o ro {sh_quote(check_mount_path(cfg.pristine[0]))} {HANDOVER}/pristine")
        else:  # an overlay of lower layers only is read-only
            common = os.path.commonpath([str(p) for p in cfg.pristine])
            lowers = ":".join(os.path.relpath(check_mount_path(p), common) for p in cfg.pristine)
            steps.append(f"cd {sh_quote(common)} && mount -t overlay overlay -o {sh_quote('ro,lowerdir=' + lowers)} "
                         f"{HANDOVER}/pristine && cd /")
    steps += [f"touch {HANDOVER}/empty && chmod 0444 {HANDOVER}/empty",
              f"mkdir {HANDOVER}/emptydir && chmod 0555 {HANDOVER}/emptydir"]
    for i, (mode, source, box) in enumerate(cfg.binds):
        if mode == "pristine":
            bw += ["--ro-bind", f"{HANDOVER}/pristine/{source}", box]
        elif mode == "agent":
            bw += ["--bind", f"{HANDOVER}/root/{source}", box]
        elif mode in ("ro", "rw"):
            kind = "mkdir" if os.path.isdir(source) else "touch"
            steps.append(f"{kind} {HANDOVER}/b{i} && mount --bind {sh_quote(source)} {HANDOVER}/b{i}")
            bw += ["--ro-bind" if mode == "ro" else "--bind", f"{HANDOVER}/b{i}", box]
        elif mode == "cow":  # a writable copy-on-write view of the image's folder `source`, upper on a tmpfs
            c = f"{HANDOVER}/c{i}"
            steps += [f"mkdir {c} && mount -t tmpfs -o size={64 << 30},mode=0755 conch-cow {c}",
                      f"mkdir {c}/u {c}/w {c}/m && chown {ID_BASE}:{ID_BASE} {c}/u",
                      f"mount -t overlay overlay -o {sh_quote(f'lowerdir={HANDOVER}/pristine/{source},upperdir={c}/u,workdir={c}/w')} {c}/m"]
            bw += ["--bind", f"{c}/m", box]
        elif mode == "tmpfs":  # source: the size cap in bytes
            bw += ["--perms", "0777", "--size", source, "--tmpfs", box]
        elif mode in ("mask-file", "mask-dir"):
            bw += ["--ro-bind", f"{HANDOVER}/{'empty' if mode == 'mask-file' else 'emptydir'}", box]
        else:
            raise ValueError(f"unknown bind mode {mode!r}")
    return steps


def _overlay_steps(cfg: BoxConfig) -> list[str]:
    """Shell lines (host root, private mount namespace) that mount the box's overlay root at state/merged."""
    steps = []
    if cfg.disk_image is not None or cfg.tmpfs_mb is not None:
        rw = cfg.state_dir / "rw"
        if cfg.disk_image is not None:
            steps.append(f"mount -o loop,nosuid,nodev {sh_quote(str(cfg.disk_image))} {sh_quote(str(rw))}")
        else:
            steps.append(f"mount -t tmpfs -o size={cfg.tmpfs_mb}m,nosuid,nodev tmpfs {sh_quote(str(rw))}")
        upper, work = rw / "upper", rw / "work"
        steps.append(f"mkdir -p {sh_quote(str(upper))} {sh_quote(str(work))}")
        if cfg.upper_dirs:
            steps.append("mkdir -p " + " ".join(sh_quote(str(upper / rel)) for rel in cfg.upper_dirs))
        if cfg.upper_files:
            steps.append("touch " + " ".join(sh_quote(str(upper / rel)) for rel in cfg.upper_files))
        for host, box in cfg.box_files:
            dest = upper / box.lstrip("/")
            steps.append(f"mkdir -p {sh_quote(str(dest.parent))} && cp {sh_quote(host)} {sh_quote(str(dest))}")
        steps.append(f"chown -R {ID_BASE}:{ID_BASE} {sh_quote(str(upper))}")
    else:
        assert cfg.upper_dir is not None and cfg.work_dir is not None
        upper, work = cfg.upper_dir, cfg.work_dir
    common = Path(os.path.commonpath([str(p) for p in cfg.lowers]))
    if common.is_file():
        common = common.parent
    opts = overlay_options(list(cfg.lowers), upper, work, common)
    steps.append(f"cd {sh_quote(str(common))}")
    steps.append(f"mount -t overlay overlay -o {sh_quote(opts)} {sh_quote(str(cfg.state_dir / 'merged'))}")
    steps.append("cd /")
    return steps


def _sys_args(cfg: BoxConfig) -> list[str]:
    """bwrap arguments for the box's /sys: a tmpfs with the host's CPU topology and the box's own cgroups, all
    read-only (the host's /sys would show every other box's cgroup and the host's power and device controls)."""
    args = ["--tmpfs", "/sys"]
    for view in SYS_VIEWS:
        if os.path.isdir(view):
            args += ["--ro-bind", view, view]
    for host, box in cfg.cgroup_views:
        args += ["--ro-bind", host, box]
    return [*args, "--remount-ro", "/sys"]


def shift_tree(top: Path) -> None:
    """Give box ids to host-written files: every owner below ID_BASE becomes ID_BASE + owner.

    Layers written on the host (debootstrap, COPY, WORKDIR) hold host ids 0..65535; files written inside a
    box already carry shifted ids, so the shift is idempotent. chown clears setuid/setgid bits and file
    capabilities: both are put back."""
    def shift(path: str, st: os.stat_result) -> None:
        uid = st.st_uid + ID_BASE if st.st_uid < ID_BASE else st.st_uid
        gid = st.st_gid + ID_BASE if st.st_gid < ID_BASE else st.st_gid
        if (uid, gid) == (st.st_uid, st.st_gid):
            return
        caps = None
        if stat.S_ISREG(st.st_mode):
            try:
                caps = os.getxattr(path, "security.capability", follow_symlinks=False)
            except OSError:
                caps = None
        os.lchown(path, uid, gid)
        if not stat.S_ISLNK(st.st_mode) and st.st_mode & (stat.S_ISUID | stat.S_ISGID):
            os.chmod(path, stat.S_IMODE(st.st_mode))
        if caps is not None:
            os.setxattr(path, "security.capability", caps, follow_symlinks=False)

    shift(str(top), os.lstat(top))
    for dirpath, dirnames, filenames in os.walk(top):
        for name in (*dirnames, *filenames):
            path = os.path.join(dirpath, name)
            shift(path, os.lstat(path))


def _ns_changed(pid: int, mine: str) -> bool:
    try:
        return os.readlink(f"/proc/{pid}/ns/user") != mine
    except FileNotFoundError:
        return True  # it died; the caller sees that on write or wait


def write_id_maps(pid: int, timeout: float = 10.0) -> None:
    """Wait until `pid` has entered its new user namespace, then map box ids 0..65535 to ID_BASE + id."""
    mine = os.readlink("/proc/self/ns/user")
    deadline = time.monotonic() + timeout
    while not _ns_changed(pid, mine):
        if time.monotonic() > deadline:
            raise SandboxError("the sandbox launcher did not create its user namespace in time")
        time.sleep(0.0002)
    try:
        for name in ("uid_map", "gid_map"):
            with open(f"/proc/{pid}/{name}", "w") as fh:
                fh.write(f"0 {ID_BASE} {ID_RANGE}\n")
    except (FileNotFoundError, ProcessLookupError, PermissionError, OSError) as exc:
        raise SandboxError(f"could not set the sandbox's uid/gid maps: {exc}") from exc


def run_box(cfg: BoxConfig, argv: list[str], *, env: dict[str, str], cwd: str = "/", stdin_data: bytes | None = None,
            log_prefix: str = "", capture: bool = False, timeout: float | None = None) -> tuple[int, str]:
    """Run one command in a fresh box and wait for it (build steps). Returns (exit code, last output).

    Output is streamed to stderr with `log_prefix` unless `capture`; the last ~4 KB are returned either way.
    """
    (cfg.state_dir / "merged").mkdir(parents=True, exist_ok=True)
    full_env = {"PATH": DEFAULT_PATH, **env}
    box_argv = ["env", "-i", *[f"{k}={v}" for k, v in full_env.items()], *argv]
    proc = subprocess.Popen(launcher_argv(cfg, box_argv, as_pid_1=False, cwd=cwd), stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={"PATH": DEFAULT_PATH})
    assert proc.stdin is not None and proc.stdout is not None
    def feed() -> None:
        try:
            proc.stdin.write(b"go\n" + (stdin_data or b""))  # type: ignore[union-attr]
            proc.stdin.close()  # type: ignore[union-attr]
        except BrokenPipeError:
            pass

    try:
        write_id_maps(proc.pid)
    except SandboxError:
        pass  # the launcher failed early; its output says why
    feeder = threading.Thread(target=feed, daemon=True)
    feeder.start()
    tail = bytearray()
    at_line_start = True
    deadline = None if timeout is None else time.monotonic() + timeout
    for chunk in iter(lambda: proc.stdout.read1(65536), b""):  # type: ignore[union-attr]
        tail += chunk
        del tail[:-4096]
        if not capture:
            text = chunk.decode("utf-8", "replace")
            if log_prefix:
                lines = text.split("\n")
                text = "\n".join((log_prefix + ln if (i > 0 or at_line_start) and ln else ln)
                                 for i, ln in enumerate(lines))
                at_line_start = chunk.endswith(b"\n")
            sys.stderr.write(text)
            sys.stderr.flush()
        if deadline is not None and time.monotonic() > deadline:
            proc.kill()
    rc = proc.wait()
    return rc, tail.decode("utf-8", "replace")


# --- cgroups ---------------------------------------------------------------------------------------------------

_CG_ROOT = Path("/sys/fs/cgroup")


def _own_cgroup(controller: str) -> str:
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, ctrls, path = line.split(":", 2)
        if controller in ctrls.split(","):
            return path
    return "/"


class Cgroups:
    """Per-sandbox cgroups.

    cgroup v1 (pids, memory, cpu hierarchies): under this process's own cgroups, so outer limits still apply.
    cgroup v2 only: under /sys/fs/cgroup/conch (see `_create_v2`). Otherwise no limits, with one warning.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.paths: list[Path] = []

    @staticmethod
    def from_paths(paths: list[str]) -> Cgroups:
        cg = Cgroups("")
        cg.paths = [Path(p) for p in paths]
        return cg

    def create(self, limits: Limits) -> None:
        v1 = [c for c in ("pids", "memory", "cpu", "freezer") if (_CG_ROOT / c / "cgroup.procs").exists()]
        settings: dict[str, list[tuple[str, str]]] = {
            "pids": [("pids.max", str(limits.pids))],
            "memory": [("memory.limit_in_bytes", str(limits.memory_mb << 20)),
                       ("memory.memsw.limit_in_bytes", str(limits.memory_mb << 20))],
            "cpu": [("cpu.cfs_period_us", "100000"), ("cpu.cfs_quota_us", str(int(limits.cpus * 100000)))],
            "freezer": [],  # no limit: `freeze` stops the box while its filesystem is verified
        }
        if v1:
            for ctrl in v1:
                path = _CG_ROOT / ctrl / _own_cgroup(ctrl).lstrip("/") / f"conch-{self.name}"
                try:
                    path.mkdir(exist_ok=True)
                except OSError as exc:
                    warn_once(f"cg-{ctrl}", f"cgroup {ctrl} not writable ({exc}); that limit is not enforced")
                    continue
                self.paths.append(path)
                for fname, value in settings[ctrl]:
                    try:
                        (path / fname).write_text(value)
                    except OSError as exc:
                        if fname != "memory.memsw.limit_in_bytes":  # absent without swap accounting
                            warn_once(f"cg-{fname}", f"could not set {fname} ({exc}); not enforced")
            return
        if (_CG_ROOT / "cgroup.controllers").exists():
            self._create_v2(limits)
            return
        warn_once("cg-none", "no writable cgroups; cpu/memory/pids limits are not enforced")

    def _create_v2(self, limits: Limits) -> None:
        """cgroup v2: a leaf under /sys/fs/cgroup/conch. A process's own cgroup usually holds processes, and
        v2 forbids enabling controllers below such a cgroup, so we start from the root (as root may)."""
        wanted = [c for c in ("pids", "memory", "cpu") if c in (_CG_ROOT / "cgroup.controllers").read_text().split()]
        enable = " ".join(f"+{c}" for c in wanted)
        parent = _CG_ROOT / "conch"
        try:
            if not set(wanted) <= set((_CG_ROOT / "cgroup.subtree_control").read_text().split()):
                (_CG_ROOT / "cgroup.subtree_control").write_text(enable)
            parent.mkdir(exist_ok=True)
            (parent / "cgroup.subtree_control").write_text(enable)
            leaf = parent / f"conch-{self.name}"
            leaf.mkdir(exist_ok=True)
            self.paths.append(leaf)
            values = {"pids.max": str(limits.pids), "memory.max": str(limits.memory_mb << 20),
                      "memory.swap.max": "0", "cpu.max": f"{int(limits.cpus * 100000)} 100000"}
            for fname, value in values.items():
                if (leaf / fname).exists():
                    (leaf / fname).write_text(value)
            missing = sorted({"pids", "memory", "cpu"} - set(wanted))
            if missing:
                warn_once("cg2-missing", f"cgroup v2 controllers {', '.join(missing)} unavailable; not enforced")
        except OSError as exc:
            warn_once("cg2", f"cgroup v2 limits not available ({exc}); cpu/memory/pids limits not enforced")

    def procs_files(self, limited: bool = True) -> list[str]:
        """cgroup.procs files a sandbox process joins. `limited=False` (control commands, which must work
        during a fork bomb) leaves out the pids limit: the v1 pids hierarchy, or the v2 leaf altogether."""
        if limited:
            return [str(p / "cgroup.procs") for p in self.paths]
        return [str(p / "cgroup.procs") for p in self.paths if p.parent.name != "conch" and "/pids/" not in str(p)]

    def views(self) -> tuple[tuple[str, str], ...]:
        """(host dir, box dir) pairs showing this box its own cgroups at /sys/fs/cgroup (read-only)."""
        if any(p.parent.name == "conch" for p in self.paths):  # v2: one leaf holds every controller
            return tuple((str(p), "/sys/fs/cgroup") for p in self.paths[:1])
        return tuple((str(p), f"/sys/fs/cgroup/{p.relative_to(_CG_ROOT).parts[0]}") for p in self.paths)

    def pids(self) -> set[int]:
        found: set[int] = set()
        for p in self.paths:
            try:
                found.update(int(x) for x in (p / "cgroup.procs").read_text().split())
            except OSError:
                pass
        return found

    def freeze(self, timeout: float = 10.0) -> None:
        """Stop every process of the box where it stands (cgroup freezer; SIGSTOP without one), so nothing of
        it runs, forks or writes until `thaw`."""
        deadline = time.monotonic() + timeout
        for p in self.paths:
            if (p / "freezer.state").exists():  # v1
                (p / "freezer.state").write_text("FROZEN")
                while (p / "freezer.state").read_text().strip() != "FROZEN":
                    if time.monotonic() > deadline:
                        raise SandboxError(f"could not freeze the sandbox's processes ({p})")
                    time.sleep(0.002)
                return
            if (p / "cgroup.freeze").exists():  # v2
                (p / "cgroup.freeze").write_text("1")
                while "frozen 1" not in (p / "cgroup.events").read_text():
                    if time.monotonic() > deadline:
                        raise SandboxError(f"could not freeze the sandbox's processes ({p})")
                    time.sleep(0.002)
                return
        stopped: set[int] = set()
        while (pids := self.pids() - stopped) and time.monotonic() < deadline:  # no freezer: stop until stable
            for pid in pids:
                try:
                    os.kill(pid, 19)  # SIGSTOP
                except ProcessLookupError:
                    pass
            stopped |= pids

    def thaw(self) -> None:
        for p in self.paths:
            for name, value in (("freezer.state", "THAWED"), ("cgroup.freeze", "0")):
                if (p / name).exists():
                    (p / name).write_text(value)
        for pid in self.pids():
            try:
                os.kill(pid, 18)  # SIGCONT (what the fallback stopped)
            except ProcessLookupError:
                pass

    def kill_all(self, timeout: float = 5.0) -> None:
        for p in self.paths:
            if (p / "cgroup.kill").exists():  # cgroup v2, Linux 5.14+
                try:
                    (p / "cgroup.kill").write_text("1")
                except OSError:
                    pass
        deadline = time.monotonic() + timeout
        while (pids := self.pids()) and time.monotonic() < deadline:
            for pid in pids:
                try:
                    os.kill(pid, 9)
                except ProcessLookupError:
                    pass
            for p in self.paths:  # a frozen (v1) process dies of its SIGKILL only once thawed
                if (p / "freezer.state").exists():
                    try:
                        (p / "freezer.state").write_text("THAWED")
                    except OSError:
                        pass
            time.sleep(0.01)

    def remove(self) -> None:
        for p in self.paths:
            for _ in range(100):
                try:
                    p.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.01)


def proc_start_time(pid: int) -> int | None:
    """Kernel start time of `pid` (to tell a live owner from a recycled pid), or None when gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])
