"""One root config for `conch train`: typed sections, every field documented, TOML plus dotted overrides.

Why dataclasses and not dicts: a typo in a key or a string where a number belongs fails at load time with the
file and the field named, not twenty minutes into a run. `conch config show` prints the resolved config with each
field's documentation, so the config is its own reference.

The defaults are what a real run wants (no time budget, 300 turns, the model's context); whole configs for one
purpose, the CPU demo first, are presets (conch/presets.py, conch/configs/*.toml). Precedence: defaults < preset
< --config file < dotted overrides.
"""

from __future__ import annotations

import dataclasses
import json
import tomllib
import types
import typing
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from conch.sandbox import registry as sandbox_registry


class ConfigError(ValueError):
    """A bad config file, key or value; the message names where."""


def opt(default: Any, doc: str, *, choices: tuple | None = None, ge: float | None = None,
        gt: float | None = None, le: float | None = None, lt: float | None = None, check: Any = None) -> Any:
    """A documented config field; `choices`, the bounds and `check` (value -> None, or what is wrong with it)
    are checked whenever a value is set."""
    meta = {"doc": doc, "choices": choices, "ge": ge, "gt": gt, "le": le, "lt": lt, "check": check}
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


def check_value(meta: Any, val: Any, name: str) -> None:
    """Raise ConfigError when `val` breaks the constraints declared on its field."""
    choices = meta.get("choices")
    if choices and val not in choices:
        raise ConfigError(f"{name} must be one of {', '.join(map(str, choices))}, got {val!r}")
    problem = meta.get("check") and meta["check"](val)
    if problem:
        raise ConfigError(f"{name} {problem}, got {val!r}")
    if not isinstance(val, (int, float)) or isinstance(val, bool):
        return
    for key, ok, word in (("ge", lambda a, b: a >= b, ">="), ("gt", lambda a, b: a > b, ">"),
                          ("le", lambda a, b: a <= b, "<="), ("lt", lambda a, b: a < b, "<")):
        bound = meta.get(key)
        if bound is not None and not ok(val, bound):
            raise ConfigError(f"{name} must be {word} {bound}, got {val!r}")


def _three_shares(val: list[float]) -> str | None:
    if len(val) != 3 or any(v < 0 for v in val) or abs(sum(val) - 1.0) > 1e-6:
        return "must be three non-negative shares (SFT, PPO pool, evaluation) summing to 1"
    return None


def _zero_or_16(val: int) -> str | None:
    return None if val == 0 or val >= 16 else "must be 0 (the model's context) or >= 16"


@dataclass
class CorpusConfig:
    train_tasks: str = opt("", "folder of training tasks; empty: synthesize the train split into RUNDIR/corpus")
    eval_tasks: str = opt("", "folder of evaluation tasks; empty: synthesize new seeds of the training families")
    n_train: int = opt(150, "synthesized training tasks, each with an expert trajectory (the SFT data)", ge=0)
    n_rl: int = opt(400, "extra synthesized tasks of the training families without expert trajectories: the PPO "
                       "pool (0: PPO trains on the training tasks). RL needs only a verifier, so its pool can be "
                       "larger than the demonstrations, and PPO overfits less than on the demonstrated tasks", ge=0)
    mistake_rate: float = opt(0.5, "share of expert demonstrations that show the family's typical mistake (a real "
                                   "run that passes some tests but not all) instead of the reference solution: an "
                                   "imperfect expert, as real ones are, so SFT imitates a mix and PPO must find from "
                                   "the verifier which way passes (0: a perfect expert)", ge=0.0, le=1.0)
    n_eval: int = opt(60, "synthesized evaluation tasks (train families, seeds never trained on)", ge=0)
    n_heldout: int = opt(10, "synthesized tasks of the heldout families (transfer to unseen kinds of task)", ge=0)
    families: list[str] = opt([], "train families to synthesize when corpus.train_tasks is empty (empty: every "
                                  "family of the train split; the demo preset names the five starter families "
                                  "sized for the tiny model)")
    seed: int = opt(1, "synthesis seed of the training tasks (eval uses disjoint seeds); also the seed of "
                       "corpus.split")
    split: list[float] = opt([0.3, 0.5, 0.2], "with corpus.train_tasks and no corpus.eval_tasks: shares of the "
                                               "user's tasks for SFT demonstrations, the PPO pool and evaluation "
                                               "(three, summing to 1; by task, seeded by corpus.seed)",
                              check=_three_shares)
    sft_data: str = opt("", "demonstrations for the SFT warm start: a JSONL file of OpenAI-style chats "
                            "({\"messages\": [...]} with tool_calls) or ATIF trajectories, or a folder of "
                            ".json/.jsonl files; empty: the training tasks' solution/solve.sh, run in the "
                            "sandbox and kept only when they pass")
    decontam_against: str = opt("", "folder of reference (benchmark) tasks; the user's tasks that nearly copy one "
                                    "are dropped before training (report: RUNDIR/decontam.json)")


@dataclass
class ModelConfig:
    path: str = opt("", "HF checkpoint folder; empty: initialise the embedded tiny Qwen3-MoE")
    size: str = opt("tiny", "size of the initialised model when path is empty: tiny or small",
                     choices=("tiny", "small"))
    sampler_dtype: str = opt("float32", "engine dtype (float32 or bfloat16); bfloat16 reproduces the inference gap",
                              choices=("float32", "bfloat16"))
    trainer_dtype: str = opt("float32", "trainer dtype", choices=("float32", "bfloat16"))
    trainer_device: str = opt("cpu", "device of the trainer (policy, critic, optimizer): cpu or cuda. Next to "
                                     "trainer_dtype, as the trainer has no section of its own; the engine's "
                                     "device is engine.device", choices=("cpu", "cuda"))


@dataclass
class EngineConfig:
    backend: str = opt("hf", "inference engine: hf (in-process, conch/engine/hf.py) or vllm (a vLLM server over "
                             "HTTP, token ids in and out, routed experts returned for R3)", choices=("hf", "vllm"))
    device: str = opt("cpu", "device the engine runs on: cpu or cuda (vllm: the server's device; on cpu conch's "
                             "vLLM plugin must be installed, see `make install-vllm`)", choices=("cpu", "cuda"))
    dtype: str = opt("", "engine dtype; empty: model.sampler_dtype", choices=("", "float32", "bfloat16"))
    url: str = opt("", "vllm: base URL of a running server to attach to (e.g. http://127.0.0.1:8000); it must "
                       "serve the run's model with --enable-return-routed-experts. Empty: see launch")
    launch: bool = opt(True, "vllm without url: start the server as a subprocess bound to 127.0.0.1, wait for its "
                             "health check and stop it at the end (its log goes to RUNDIR/vllm-server.log)")
    python: str = opt("", "vllm launch: python of the vLLM environment; empty: .venv-vllm/bin/python if present, "
                          "else the current python")
    port: int = opt(0, "vllm launch: port on 127.0.0.1 (0: a free one)", ge=0, le=65535)
    startup_timeout: float = opt(600.0, "vllm launch: seconds to wait for the server's health check", gt=0)
    extra_args: list[str] = opt([], "vllm launch: extra `vllm serve` arguments, e.g. [\"--max-model-len\", \"8192\"]")


@dataclass
class AgentLoopConfig:
    """`[agent]`: the agent loop's settings, and the very object the loop takes (conch/agent/loop.py); Ray
    workers get it as a plain dict (`dataclasses.asdict`) and rebuild it."""

    max_turns: int = opt(300, "assistant turns per episode at most (terminal tasks take tens to hundreds; the "
                              "episode also ends at the context limit)", ge=1)
    max_new_tokens: int = opt(2048, "tokens per assistant turn at most: a guard against a runaway turn, not a "
                                    "target (a turn ends at the model's end of turn). 2048 holds a paragraph of "
                                    "reasoning plus a heredoc that writes a ~150-line file, the longest ordinary "
                                    "terminal action, and is 5% of a 40k context, so one looping turn cannot eat "
                                    "the episode; a thinking model that reasons at length may want more", ge=1)
    max_context: int = opt(0, "context limit of an episode in tokens (prompt, turns and observations); 0: the "
                              "model's max_position_embeddings (its config.json); never above the model's",
                           ge=0, check=_zero_or_16)
    obs_token_budget: int = opt(256, "observation tokens kept per command (head and tail)", ge=1)
    command_timeout: float = opt(30.0, "seconds per command", gt=0)
    temperature: float = opt(1.0, "sampling temperature for training rollouts", ge=0.0)
    top_p: float = opt(1.0, "nucleus sampling for training rollouts", gt=0.0, le=1.0)
    top_k: int = opt(0, "top-k sampling for training rollouts (0: off, every token may be drawn)", ge=0)
    mode: str = opt("tito", "tito (exact sampled ids) or retokenize (naive loop, for comparison)",
                     choices=("tito", "retokenize"))
    max_parse_errors: int = opt(3, "consecutive malformed turns (a tool call that does not parse) that end the "
                                   "episode", ge=1)
    agent_timeout: float = opt(0.0, "seconds an episode may act at most, turns and commands together (0: the "
                                    "task's own [agent] timeout_sec)", ge=0.0)


@dataclass
class SFTConfig:
    demos: int = opt(0, "expert trajectories the warm start learns from, balanced over families (0: one per "
                        "training task); PPO's task pool is unaffected", ge=0)
    steps: int = opt(600, "optimizer steps of the warm start at most; it normally ends earlier, at the plateau "
                          "of its validation loss (see patience and lr_cuts)", ge=0)
    lr: float = opt(1e-5, "peak learning rate, reached after a linear warm-up of min(20, steps / 10) steps (1e-5: "
                          "full fine-tuning of a pretrained model; the demo's randomly initialised tiny model: 4e-3)",
                    gt=0.0)
    batch_size: int = opt(8, "trajectories per step", ge=1)
    val_fraction: float = opt(0.1, "share of expert trajectories held out for the validation-loss curve",
                               ge=0.0, lt=1.0)
    eval_every: int = opt(20, "steps between validation-loss measurements", ge=1)
    patience: int = opt(3, "validations without an improvement of the validation loss (by more than 0.001) that "
                           "make a plateau", ge=1)
    lr_cuts: int = opt(2, "plateaus at which the learning rate is cut (x0.3) and training goes on from the best "
                          "weights; the next plateau ends the warm start, keeping the best weights", ge=0)


@dataclass
class CriticConfig:
    iterations: int = opt(2, "critic warm-up iterations (rollouts of the frozen warm policy)", ge=0)
    epochs: int = opt(4, "passes over each batch of rollouts", ge=1)
    patience: int = opt(2, "stop when explained variance has not improved this many iterations", ge=1)


@dataclass
class PPOConfig:
    iterations: int = opt(16, "PPO iterations (the run stops earlier at run.time_budget_minutes)", ge=0)
    tasks_per_iter: int = opt(16, "tasks sampled per iteration", ge=1)
    n_per_task: int = opt(4, "rollouts per task (K)", ge=1)
    concurrency: int = opt(16, "trajectories in flight", ge=1)
    lr: float = opt(1e-6, "actor learning rate (1e-6: PPO on a pretrained LLM; the demo's tiny model: 1e-4)", gt=0.0)
    critic_lr: float = opt(5e-6, "critic learning rate, in the critic warm-up too (5e-6: a value model initialised "
                                 "from a pretrained LLM; the demo's tiny model: 1e-3)", gt=0.0)
    epochs: int = opt(2, "optimisation passes over each batch", ge=1)
    micro_batch: int = opt(4, "trajectories per forward/backward", ge=1)
    grad_accum: int = opt(4, "micro-batches per optimizer step", ge=1)
    max_grad_norm: float = opt(1.0, "gradient clipping", gt=0.0)
    gamma: float = opt(1.0, "discount per sampled token", ge=0.0, le=1.0)
    lam: float = opt(1.0, "GAE lambda", ge=0.0, le=1.0)
    loss_agg: str = opt("token-mean", "loss aggregation: token-mean (every sampled token weighs the same) or "
                                      "seq-mean-token-mean (every trajectory weighs the same)",
                        choices=("token-mean", "seq-mean-token-mean"))
    group_baseline: bool = opt(True, "subtract each task's mean reward over its K rollouts before GAE (variance "
                                      "reduction while the critic is young)")
    clip_low: float = opt(0.2, "policy ratio clip below 1", gt=0.0, lt=1.0)
    clip_high: float = opt(0.28, "policy ratio clip above 1 (asymmetric clip)", gt=0.0)
    dual_clip: float = opt(3.0, "dual-clip bound for negative advantages (0: off)", ge=0.0)
    value_clip: float = opt(0.5, "value clip around old values (0: off)", ge=0.0)
    kl_coef: float = opt(0.0, "KL penalty to the warm policy (0: off)", ge=0.0)
    entropy_coef: float = opt(0.0, "entropy bonus", ge=0.0)
    tis_cap: float = opt(2.0, "truncated importance-sampling cap for the train/inference gap (0: off)", ge=0.0)
    mask_low: float = opt(0.0, "drop from the policy loss the tokens whose train/sample ratio exp(old - sampler "
                               "log-prob) is below this (IcePop/MIS style; 0: off)", ge=0.0)
    mask_high: float = opt(0.0, "... or above this (0: off); e.g. 0.5 and 2.0 with off_policy_steps >= 1", ge=0.0)
    off_policy_steps: int = opt(0, "rollouts of iteration k+1 are sampled while the learner trains on k, with "
                                   "weights at most this many updates old (0: strictly on-policy, no overlap)",
                                ge=0, le=1)
    routing_replay: bool = opt(True, "R3: replay the sampler's expert choices in the trainer (MoE models only)")
    eval_every: int = opt(0, "iterations between evaluations (0: only the final one)", ge=0)
    checkpoint_every: int = opt(1, "iterations between checkpoints", ge=1)
    keep_checkpoints: int = opt(2, "checkpoints kept", ge=1)


@dataclass
class RewardConfig:
    mode: str = opt("count", "count (passing tests), fraction, binary, progress (turn-level deltas), or "
                     "count_over_nop (passing tests minus those a do-nothing agent passes, measured once per task "
                     "and cached; floor 0)",
                     choices=("count", "fraction", "binary", "progress", "count_over_nop"))
    verify_every: int = opt(4, "progress mode: run the verifier every k turns", ge=1)


@dataclass
class EvalConfig:
    n_per_task: int = opt(4, "samples per evaluation task", ge=1)
    temperature: float = opt(1.0, "evaluation sampling temperature (1: the policy's own distribution, as "
                                    "trained; 0: greedy)", ge=0.0)


@dataclass
class RunConfig:
    seed: int = opt(0, "global seed")
    jobs: int = opt(2, "sandboxes at once for corpus validation", ge=1)
    tensorboard: bool = opt(False, "also log to TensorBoard (needs the tensorboard package)")
    wandb: bool = opt(False, "also log to Weights & Biases (needs wandb)")
    wandb_project: str = opt("conch", "W&B project the run is logged to")
    wandb_mode: str = opt("online", "W&B mode: online, offline (sync later with `wandb sync`) or disabled",
                          choices=("online", "offline", "disabled"))
    name: str = opt("", "run name in W&B ('': the run folder's name)")
    keep_rollouts: int = opt(4, "PPO rollouts kept per iteration in RUNDIR/trajectories (-1: all; 0: none); "
                                "every evaluation's trajectories are always kept", ge=-1)
    time_budget_minutes: float = opt(0.0, "stop PPO early once the run has taken this many minutes, then evaluate "
                                          "and summarise (0: no limit, every ppo.iterations runs)", ge=0.0)


@dataclass
class SandboxConfig:
    backend: str = opt("local", "sandbox backend: " + " or ".join(sandbox_registry.names()),
                       choices=sandbox_registry.names())
    network: str = opt("never", "network of task sandboxes at run time: never (offline; builds only), or task "
                       "(a task with allow_internet = true may reach the package registries, PyPI, Debian, npm, "
                       "through a proxy; nothing else)", choices=("never", "task"))


@dataclass
class ClusterConfig:
    backend: str = opt("local", "where rollouts run: local (this process: one engine, one sandbox pool) or ray "
                                "(rollout workers as Ray actors, each with an engine replica and its own sandboxes)",
                       choices=("local", "ray"))
    address: str = opt("", "ray: the cluster to join (auto, ray://host:10001, or host:6379); empty: start a local "
                           "Ray instance on this machine")
    rollout_workers: int = opt(2, "ray: rollout worker actors", ge=1)
    sandboxes_per_worker: int = opt(8, "ray: episodes (sandboxes and engine sessions) in flight per worker", ge=1)
    worker_cpus: float = opt(1.0, "ray: CPUs reserved per rollout worker (also its torch threads)", ge=0.0)
    worker_gpus: float = opt(0.0, "ray: GPUs reserved per rollout worker (an engine replica on GPU)", ge=0.0)
    worker_resources: dict = opt({}, "ray: custom resources per rollout worker, e.g. {sandbox_node = 1} so the "
                                     "sandbox pools land on the nodes started with --resources='{\"sandbox_node\": 64}'")
    start_timeout: float = opt(120.0, "ray: seconds to wait for every rollout worker to be placed and started", gt=0)
    learner_ranks: int = opt(1, "data-parallel learner ranks (FSDP2; gloo on CPU, NCCL with model.trainer_device = "
                                "cuda, one GPU per rank on this node): 1 trains in this process; N > 1 starts N-1 "
                                "follower processes here; under torchrun the ranks come from WORLD_SIZE (leave 1 or "
                                "match it). Each optimizer step's micro-batches (ppo.grad_accum) are split over the "
                                "ranks, so a multiple of N keeps every rank busy. N > 1 writes sharded checkpoints "
                                "(torch.distributed.checkpoint; docs/cluster.md)", ge=1)
    learner_timeout: float = opt(600.0, "learner ranks: seconds one collective waits for a rank before the run stops "
                                        "with an error (a rank that exits is noticed at once)", gt=0)


@dataclass
class Config:
    preset = ""  # not a field: the preset this config was built on (recorded in config.toml's first line)
    run: RunConfig = field(default_factory=RunConfig)
    corpus: CorpusConfig = field(default_factory=CorpusConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    agent: AgentLoopConfig = field(default_factory=AgentLoopConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    critic: CriticConfig = field(default_factory=CriticConfig)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)




def _coerce(value: Any, typ: Any, where: str) -> Any:
    origin = typing.get_origin(typ)
    if typ is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "false", "1", "0", "yes", "no"):
            return value.lower() in ("true", "1", "yes")
        raise ConfigError(f"{where}: expected true/false, got {value!r}")
    if typ is int:
        if isinstance(value, bool):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        try:
            f = float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: expected an integer, got {value!r}") from None
        if f != int(f):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return int(f)
    if typ is float:
        try:
            return float(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: expected a number, got {value!r}") from None
    if typ is str:
        if not isinstance(value, (str, int, float)):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return str(value)
    if typ is list or origin is list:
        if isinstance(value, str) and value.strip().startswith("["):  # a TOML array: ["a", "b"]
            try:
                value = tomllib.loads(f"v = {value}")["v"]
            except tomllib.TOMLDecodeError as exc:
                raise ConfigError(f"{where}: expected a TOML array or comma-separated values, got {value!r} "
                                  f"({exc})") from None
        elif isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        item = typing.get_args(typ)  # list[float]: every element coerced, so config.toml stores numbers
        return [_coerce(v, item[0], f"{where}[{i}]") for i, v in enumerate(value)] if item else value
    if typ is dict or origin is dict:
        if isinstance(value, str):  # a TOML inline table or JSON object: {sandbox_node = 1}
            text = value.strip() or "{}"
            try:
                value = json.loads(text) if ":" in text else tomllib.loads(f"v = {text}")["v"]
            except (ValueError, tomllib.TOMLDecodeError) as exc:
                raise ConfigError(f"{where}: expected a table such as {{name = 1}}, got {value!r} ({exc})") from None
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a table, got {value!r}")
        return value
    if isinstance(typ, types.UnionType):
        return value
    return value


# Keys that no longer exist: (section, key) -> (the value every run folder of the time recorded, what to set
# instead). A file holding the recorded value still loads (a run folder written before the change resumes).
RETIRED = {("critic", "lr"): (1e-3, "ppo.critic_lr (the critic warm-up and PPO train one critic, at one rate)")}

# Keys that moved: (section, key) -> (section, key) now. The old one still sets the new one, with a one-line
# warning, for one release (a run folder written before the move resumes with it).
MOVED = {("run", "sandbox"): ("sandbox", "backend")}


def _moved(section: str, key: str, where: str) -> tuple[str, str]:
    if (section, key) not in MOVED:
        return section, key
    new = MOVED[section, key]
    warnings.warn(f"{where}: {section}.{key} is deprecated; it sets {'.'.join(new)} (write that instead)",
                  FutureWarning, stacklevel=3)
    return new


def _set(cfg: Config, section: str, key: str, value: Any, where: str) -> None:
    section, key = _moved(section, key, where)
    if (section, key) in RETIRED:
        recorded, instead = RETIRED[section, key]
        if where != "override" and value == recorded:
            return
        raise ConfigError(f"{where}: {section}.{key} was never used and is gone; set {instead}")
    sections = {f.name: f for f in dataclasses.fields(cfg)}
    if section not in sections:
        raise ConfigError(f"{where}: unknown section [{section}]{_did_you_mean(section, sections)}; "
                          f"sections: {', '.join(sections)}")
    sec = getattr(cfg, section)
    hints = typing.get_type_hints(type(sec))
    if key not in hints:
        raise ConfigError(f"{where}: unknown key {section}.{key}{_did_you_mean(key, hints)}; "
                          f"keys of [{section}]: {', '.join(hints)}")
    val = _coerce(value, hints[key], f"{where}: {section}.{key}")
    meta = {f.name: f.metadata for f in dataclasses.fields(sec)}[key]
    check_value(meta, val, f"{where}: {section}.{key}")
    setattr(sec, key, val)


def _did_you_mean(word: str, options: Any) -> str:
    import difflib

    close = difflib.get_close_matches(word, list(options), n=1, cutoff=0.6)
    return f" (did you mean {close[0]}?)" if close else ""


def read_toml(path: str | Path) -> tuple[dict, str]:
    """A config file's tables and its text (ConfigError naming the file when it cannot be read or parsed)."""
    p = Path(path)
    try:
        text = p.read_text()
        return tomllib.loads(text), text
    except FileNotFoundError:
        raise ConfigError(f"{p}: config file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{p}: cannot read the config file ({getattr(exc, 'strerror', None) or exc})") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{p}: invalid TOML: {exc}") from None


def apply_tables(cfg: Config, data: dict, where: str) -> None:
    for section, table in data.items():
        if not isinstance(table, dict):
            raise ConfigError(f"{where}: top-level key {section!r} must be a [section] table")
        for key, value in table.items():
            _set(cfg, section, key, value, where)


PRESET_LINE = "# preset: "  # describe()'s first line when the config was built on a preset


def load_config(path: str | Path | None = None, overrides: list[str] | tuple = (), preset: str | None = None) -> Config:
    """Defaults, then the named preset (conch/configs/NAME.toml), then the TOML file, then `section.key=value`
    overrides, validated. A file written by `describe` (RUNDIR/config.toml) is already resolved: its preset is
    recorded, not applied again."""
    cfg = Config()
    if preset:
        from conch.presets import preset_tables

        apply_tables(cfg, preset_tables(preset), f"preset {preset}")
        cfg.preset = preset
    if path:
        data, text = read_toml(path)
        apply_tables(cfg, data, str(path))
        first = text.split("\n", 1)[0]
        if not preset and first.startswith(PRESET_LINE):  # provenance only: the values below already hold it
            cfg.preset = (first[len(PRESET_LINE):].split() or [""])[0]
    for item in overrides:
        if "=" not in item or "." not in item.split("=", 1)[0]:
            raise ConfigError(f"override {item!r}: expected section.key=value")
        dotted, value = item.split("=", 1)
        section, key = dotted.split(".", 1)
        _set(cfg, section.strip(), key.strip(), value.strip(), "override")
    return cfg


def describe(cfg: Config) -> str:
    """TOML text of the resolved config with each field's documentation as a comment."""
    lines: list[str] = []
    if cfg.preset:
        lines += [f"{PRESET_LINE}{cfg.preset} (resolved: defaults < preset < --config file < overrides; --resume "
                  "reads this file as is)", ""]
    for sec_field in dataclasses.fields(cfg):
        sec = getattr(cfg, sec_field.name)
        lines.append(f"[{sec_field.name}]")
        for f in dataclasses.fields(sec):
            value = getattr(sec, f.name)
            if isinstance(value, bool):
                text = "true" if value else "false"
            elif isinstance(value, str):
                text = f'"{value}"'
            elif isinstance(value, list):
                text = "[" + ", ".join(json.dumps(v) for v in value) + "]"
            elif isinstance(value, dict):
                text = "{" + ", ".join(f"{k} = {json.dumps(v)}" for k, v in value.items()) + "}"
            else:
                text = repr(value)
            lines.append(f"{f.name} = {text}  # {f.metadata.get('doc', '')}")
        lines.append("")
    return "\n".join(lines)
