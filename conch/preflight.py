"""Checks of the paths a command was given, run before any work starts.

Why a module of its own: `conch train` used to spend half a minute synthesizing before it noticed that a task
folder did not exist, and `conch eval` printed a 31-line traceback for a model folder without weights. Every
command checks its paths here first and fails with one line that names the config key (or flag) and the problem.
All functions raise `ConfigError`, which the CLI prints without a traceback (exit status 2).
"""

from __future__ import annotations

from pathlib import Path

from conch.config import Config, ConfigError

WEIGHT_PATTERNS = ("*.safetensors", "*.bin", "*.safetensors.index.json", "*.pt")


def check_dir(path: str | Path, key: str) -> Path:
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"{key}: {p} does not exist")
    if not p.is_dir():
        raise ConfigError(f"{key}: {p} is not a folder")
    return p


def check_file(path: str | Path, key: str) -> Path:
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"{key}: {p} does not exist")
    if not p.is_file():
        raise ConfigError(f"{key}: {p} is not a file")
    return p


def check_model_dir(path: str | Path, key: str, weights: bool = True) -> Path:
    """A Hugging Face checkpoint folder: config.json, and (with `weights`) weight files."""
    p = check_dir(path, key)
    if not (p / "config.json").is_file():
        raise ConfigError(f"{key}: {p} is not a model checkpoint (no config.json)")
    if weights and not any(next(p.glob(pat), None) for pat in WEIGHT_PATTERNS):
        raise ConfigError(f"{key}: {p} is not a model checkpoint (no *.safetensors or *.bin weights)")
    return p


def check_task_dir(path: str | Path, key: str) -> Path:
    """A task folder, or a folder with task folders below it."""
    from conch.tasks.loader import find_task_dirs

    p = Path(path)
    if p.is_file() and p.name in ("task.toml", "task.yaml"):
        return p
    p = check_dir(p, key)
    if not find_task_dirs(p):
        raise ConfigError(f"{key}: {p} holds no task (no task.toml or task.yaml in it or in a folder below it)")
    return p


def check_train_paths(cfg: Config) -> None:
    """Every path of a training config, before the first stage (model weights: see `check_model_weights`)."""
    c = cfg.corpus
    if c.train_tasks:
        check_task_dir(c.train_tasks, "corpus.train_tasks")
        if not c.eval_tasks:
            from conch.rl.user_corpus import parse_split

            parse_split(c.split)
    if c.eval_tasks:
        check_task_dir(c.eval_tasks, "corpus.eval_tasks")
    if c.sft_data:
        from conch.tasks.demos import DemoFormatError, read_sft_data

        if not Path(c.sft_data).is_dir():
            check_file(c.sft_data, "corpus.sft_data")
        try:
            read_sft_data(Path(c.sft_data))
        except DemoFormatError as exc:
            raise ConfigError(f"corpus.sft_data: {exc}") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"corpus.sft_data: {c.sft_data}: cannot read ({exc})") from None
    if c.decontam_against:
        from conch.tasks.decontam import find_instructions

        p = check_dir(c.decontam_against, "corpus.decontam_against")
        if next(iter(find_instructions(p)), None) is None:
            raise ConfigError(f"corpus.decontam_against: {p} holds no task instructions "
                              f"(instruction.md or task.yaml)")
    if cfg.model.path:
        check_model_dir(cfg.model.path, "model.path", weights=False)
