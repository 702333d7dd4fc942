"""The learner over N ranks inside `conch train`: rank 0 drives the run, ranks 1..N-1 follow.

Why this shape: rank 0 runs the whole algorithm (`rl/train.py`: corpus, SFT, rollouts, evaluations, metrics,
checkpoint coordination) and the learner's parameters, gradients and Adam moments are sharded over N ranks
with FSDP2 (`rl/distributed.py`). Every learner call that touches them (score, update, weights, save, load,
publish) is a collective, so rank 0 announces each call and every follower makes the same call on its own
shard: the call's name goes through the rendezvous store, its arguments (plain data: trajectories, a seed, a
path) through a broadcast. The update splits each optimizer step's micro-batches over the ranks
(`rl/update.py`), so N ranks make the one-process update.

Followers wait for the next call on the store, which has no deadline (a rollout may take an hour); they never
wait inside a collective except for the call in hand, and collectives run under `cluster.learner_timeout`. So a
rank that dies stops the run with one error line (`LearnerRankError`, naming the rank and how it ended) rather
than a hang, and `conch train --resume` continues from the last complete checkpoint.

Launch: under torchrun (RANK, WORLD_SIZE, MASTER_ADDR/PORT in the environment) every rank runs `conch train`
and ranks > 0 become followers (`follow`); otherwise `cluster.learner_ranks = N` makes rank 0 start N-1
follower processes on this node itself (`python -m conch.rl.learner_group`).
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist

from conch.config import Config, ConfigError
from conch.rl.ranks import torchrun_env

# A follower's wait for the next call: long (rank 0 may roll out for hours; c10d logs each wait that times out,
# and the socket's poll takes int32 milliseconds), and it ends at once with an error if rank 0's store goes away.
_POLL = timedelta(days=7)


class LearnerRankError(RuntimeError):
    """A learner rank died, hung past `cluster.learner_timeout`, or failed; the run cannot go on."""


def learner_ranks(cfg: Config) -> int:
    env = torchrun_env()
    return env[1] if env else cfg.cluster.learner_ranks


def check_ranks(cfg: Config) -> None:
    """Config-time checks: torchrun's world size and `cluster.learner_ranks` agree; enough GPUs for NCCL."""
    env = torchrun_env()
    if env and cfg.cluster.learner_ranks not in (1, env[1]):
        raise ConfigError(f"cluster.learner_ranks = {cfg.cluster.learner_ranks}, but torchrun started {env[1]} "
                          f"ranks (WORLD_SIZE); leave it at 1 or set it to {env[1]}")
    n = learner_ranks(cfg)
    if n > 1 and cfg.model.trainer_device == "cuda":
        local = int(os.environ.get("LOCAL_WORLD_SIZE", n)) if env else n
        if torch.cuda.device_count() < local:
            raise ConfigError(f"cluster.learner_ranks = {n} with model.trainer_device = cuda needs {local} GPUs on "
                              f"this node (one per rank); torch sees {torch.cuda.device_count()}")


def _local_device(device: str) -> None:
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", os.environ.get("RANK", "0"))))


class Group:
    """Rank 0's end of the command channel, and the follower processes it started (none under torchrun)."""

    def __init__(self, store: Any, world: int, procs: list[subprocess.Popen], run_dir: Path, timeout: float) -> None:
        self.store, self.world, self.procs, self.run_dir, self.timeout = store, world, procs, run_dir, timeout
        self.seq = 0
        self.broken = False
        self.in_call = False  # a call was announced and has not returned: followers may sit in its collectives

    @classmethod
    def start(cls, cfg: Config, run_dir: Path) -> "Group":
        from conch.rl.stages import log

        world = learner_ranks(cfg)
        procs: list[subprocess.Popen] = []
        if torchrun_env():
            store = next(dist.rendezvous("env://"))[0]
        else:
            store = dist.TCPStore("127.0.0.1", 0, world, is_master=True, wait_for_workers=False)
            for r in range(1, world):
                env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(store.port), "RANK": str(r),
                       "WORLD_SIZE": str(world), "LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": str(world)}
                procs.append(subprocess.Popen([sys.executable, "-m", "conch.rl.learner_group"], env=env))
            log("learner ranks: " + ", ".join(f"rank {r} is pid {p.pid}" for r, p in enumerate(procs, start=1)))
        device = cfg.model.trainer_device
        _local_device(device)
        group = cls(dist.PrefixStore("conch", store), world, procs, run_dir, cfg.cluster.learner_timeout)
        try:
            group.store.set("ready", pickle.dumps({"device": device, "timeout": cfg.cluster.learner_timeout}))
            group._wait_joined()
            dist.init_process_group("nccl" if device == "cuda" else "gloo", store=dist.PrefixStore("pg", store),
                                    rank=0, world_size=world, timeout=timedelta(seconds=cfg.cluster.learner_timeout))
        except LearnerRankError:
            raise
        except Exception as exc:
            raise group.failure("start", exc) from exc
        return group

    def _wait_joined(self) -> None:
        """Every follower reached the store, watching the processes meanwhile (one that fails to import or
        start is noticed at once, not after `cluster.learner_timeout`)."""
        deadline = time.monotonic() + self.timeout
        for r in range(1, self.world):
            while True:
                self._check_alive("start")
                if self.store.check([f"joined/{r}"]):  # not store.wait: c10d logs every wait that times out
                    break
                time.sleep(0.1)
                if time.monotonic() > deadline:
                    self.broken = True
                    self.abort()
                    raise LearnerRankError(f"learner rank {r} of {self.world} did not start within "
                                           f"cluster.learner_timeout = {self.timeout:g} s")

    def call(self, name: str, args: tuple, local: Callable[[], Any]) -> Any:
        """Announce `name(*args)` to every follower, then run `local` (this rank's share of the call)."""
        if self.broken:
            raise LearnerRankError("the learner ranks stopped earlier in this run")
        self._check_alive(name)
        self.in_call = True
        try:
            self.seq += 1
            self.store.set(f"cmd/{self.seq}", name)
            if self.seq > 2:  # every follower has read it: they joined the collectives of the call after it
                self.store.delete_key(f"cmd/{self.seq - 2}")
            dist.broadcast_object_list([args], src=0)
            out = local()
        except Exception as exc:
            raise self.failure(name, exc) from exc
        self.in_call = False
        return out

    def _check_alive(self, name: str) -> None:
        if any(p.poll() is not None for p in self.procs):
            raise self.failure(name, None)

    def failure(self, name: str, exc: BaseException | None) -> LearnerRankError:
        """The error that stops the run: which rank ended and how, else the collective's own error."""
        self.broken = True
        dead = self._wait_for_dead()
        hint = f"`conch train --resume {self.run_dir}` continues from the last complete iteration"
        if dead is not None:
            r, code = dead
            how = (f"was killed by signal {-code} ({signal.Signals(-code).name})" if code < 0
                   else f"exited with status {code}")
            msg = f"learner rank {r} of {self.world} {how} (noticed at '{name}'); the run stops here; {hint}"
        else:
            first = str(exc).splitlines()[0] if exc is not None and str(exc) else ""
            msg = f"learner call '{name}' failed: {type(exc).__name__}: {first}; the run stops here; {hint}"
        self.abort()
        return LearnerRankError(msg)

    def _wait_for_dead(self, seconds: float = 5.0) -> tuple[int, int] | None:
        """A collective fails as soon as a peer's socket closes, a moment before the OS reaps the process."""
        deadline = time.monotonic() + (seconds if self.procs else 0)
        while True:
            for r, p in enumerate(self.procs, start=1):
                if p.poll() is not None:
                    return r, p.returncode
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)

    def abort(self) -> None:
        """Stop the followers this rank started (their peer is gone or mid-call; they would only wait)."""
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()

    def close(self) -> None:
        """The end of the run, normal or not: tell idle followers to stop (a barrier, so no rank tears gloo down
        while another still uses it); followers left inside an unfinished call are terminated instead."""
        from conch.rl.stages import log

        if self.broken:
            return
        if self.in_call:
            self.broken = True
            self.abort()
            return
        try:
            self.call("stop", (), dist.barrier)
        except LearnerRankError as exc:
            log(f"warning: {exc}")
            return
        for p in self.procs:
            try:
                p.wait(timeout=self.timeout)
            except subprocess.TimeoutExpired:
                log(f"warning: learner rank pid {p.pid} did not exit after the run; terminating it")
        self.abort()
        dist.destroy_process_group()


def _recv(store: Any, seq: int) -> tuple[str, tuple]:
    key = f"cmd/{seq}"
    _wait(store, key)
    name = store.get(key).decode()
    box: list[Any] = [None]
    dist.broadcast_object_list(box, src=0)
    return name, box[0]


def _wait(store: Any, key: str) -> None:
    """Wait for `key` with no deadline (rank 0 may roll out for an hour); a store that went away (rank 0 died)
    raises."""
    while True:
        try:
            store.wait([key], _POLL)
            return
        except dist.DistStoreError as exc:
            if "timeout" not in str(exc).lower():
                raise


def broadcast_weights(model: torch.nn.Module) -> None:
    """Every rank starts from rank 0's (SFT'd) weights: each tensor of the state, in state-dict order."""
    with torch.no_grad():
        for t in model.state_dict().values():
            dist.broadcast(t, src=0)


def follow() -> int:
    """A follower rank: join the group, then make every call rank 0 announces until it says stop."""
    rank = int(os.environ["RANK"])
    try:
        base = next(dist.rendezvous("env://"))[0]
        store = dist.PrefixStore("conch", base)
        store.set(f"joined/{rank}", b"1")
        _wait(store, "ready")
        setup = pickle.loads(store.get("ready"))
        _local_device(setup["device"])
        dist.init_process_group("nccl" if setup["device"] == "cuda" else "gloo",
                                store=dist.PrefixStore("pg", base),
                                rank=rank, world_size=int(os.environ["WORLD_SIZE"]),
                                timeout=timedelta(seconds=setup["timeout"]))
        _serve(store, rank)
    except Exception as exc:
        print(f"conch learner rank {rank}: error: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
              file=sys.stderr, flush=True)
        return 1
    dist.destroy_process_group()
    return 0


def _serve(store: Any, rank: int) -> None:
    from conch.rl.learner import Learner

    learner: Learner | None = None
    scored = None
    seq = 0
    while True:
        seq += 1
        name, args = _recv(store, seq)
        if name == "stop":
            dist.barrier()
            return
        if name == "init":
            learner = _follower_learner(rank, *args)
        elif name == "score":
            scored = learner.score(*args)
        elif name == "update":
            learner.update(scored, *args)
        else:
            getattr(learner, name)(*args)


def _follower_learner(rank: int, cfg: Config, model_dir: str, pad_id: int) -> Any:
    from conch.model.loading import load_policy
    from conch.rl.learner import Learner

    torch.manual_seed(cfg.run.seed)
    loaded = load_policy(Path(model_dir), dtype=cfg.model.trainer_dtype, device=cfg.model.trainer_device)
    broadcast_weights(loaded.model)
    return Learner(cfg, loaded.model, loaded.tokenizer, pad_id, dp=(rank, dist.get_world_size()))


class DriverLearner:
    """Rank 0's learner: the same methods as `Learner`, each announced to the followers first."""

    def __init__(self, local: Any, group: Group) -> None:
        self.local, self.group = local, group

    @property
    def policy(self) -> Any:
        return self.local.policy

    def score(self, trajs: list) -> Any:
        return self.group.call("score", (trajs,), lambda: self.local.score(trajs))

    def update(self, scored: Any, update_policy: bool = True, seed: int = 0) -> dict[str, float]:
        return self.group.call("update", (update_policy, seed), lambda: self.local.update(scored, update_policy, seed))

    def weights(self) -> dict[str, torch.Tensor]:
        return self.group.call("weights", (), self.local.weights)

    def save(self, run_dir: Path, iteration: int) -> Path:
        return self.group.call("save", (run_dir, iteration), lambda: self.local.save(run_dir, iteration))

    def load(self, path: Path) -> int:
        from conch.rl.sharded_checkpoint import check_loadable

        check_loadable(path, self.group.world)  # here, so no follower fails on it (which would read as a dead rank)
        return self.group.call("load", (path,), lambda: self.local.load(path))

    def save_critic(self, path: Path) -> None:
        self.group.call("save_critic", (path,), lambda: self.local.save_critic(path))

    def load_critic(self, path: Path) -> None:
        self.group.call("load_critic", (path,), lambda: self.local.load_critic(path))

    def publish(self, out: Path) -> Path:
        return self.group.call("publish", (out,), lambda: self.local.publish(out))

    def close(self) -> None:
        self.group.close()


def make_learner(cfg: Config, policy: Any, tokenizer: Any, pad_id: int, model_dir: Path, run_dir: Path) -> Any:
    """A `Learner` in this process, or (`cluster.learner_ranks` > 1, or torchrun) rank 0's `DriverLearner`.
    `model_dir` holds the architecture the followers build before they receive rank 0's weights."""
    from conch.rl.learner import Learner

    world = learner_ranks(cfg)
    if world == 1:
        return Learner(cfg, policy, tokenizer, pad_id)
    group = Group.start(cfg, run_dir)

    def init() -> Learner:
        broadcast_weights(policy)
        return Learner(cfg, policy, tokenizer, pad_id, dp=(0, world))

    return DriverLearner(group.call("init", (cfg, str(model_dir), pad_id), init), group)


if __name__ == "__main__":  # a follower rank 0 started: rank 0 alone handles Ctrl-C and stops it
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise SystemExit(follow())
