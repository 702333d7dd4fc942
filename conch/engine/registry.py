"""The engine registry: one config key (`engine.backend`) picks the inference engine every sampling command uses.

Why a registry: `train`, `eval`, `rollout` and the benchmarks must sample with the same engine a user chose (the
in-process HF engine on a laptop, a vLLM server for a real checkpoint on a GPU) without each of them knowing how
an engine is built. Each backend is one factory here; commands pass `EngineOptions` (the config's `EngineConfig`
with the run's log path and in-process extras) and get an object that satisfies `conch.engine.base.Engine`. A new
backend (e.g. "sglang") is one more entry in `BACKENDS` (and in `engine.backend`'s choices, which a test holds
equal: conch.config cannot import this module, which builds on it).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable

from conch.config import EngineConfig, ModelConfig

SAMPLER_DTYPE = ModelConfig.sampler_dtype  # the engine dtype when neither engine.dtype nor a config says one


@dataclass
class EngineOptions(EngineConfig):
    """The config's `[engine]` section (`EngineConfig`: every field, with its default and documentation) plus what
    only a running command knows. Built from a config by `options_from_config` and from flags by
    `options_for_command`/`options_from_args`, never field by field: a field added to `[engine]` reaches the
    engine with no edit here. `dtype` empty: model.sampler_dtype (of the config, else its default)."""

    log_path: str = ""  # vllm launch: where the server's log goes (empty: a temporary file)
    hf_kwargs: dict = field(default_factory=dict)  # hf only: e.g. native_attention, torch_threads

    def __post_init__(self) -> None:
        self.extra_args = tuple(str(a) for a in self.extra_args)  # type: ignore[assignment] # argv, not a knob list


def options_from_config(cfg: Any, log_dir: Path | None = None) -> EngineOptions:
    """EngineOptions from a root `Config` (`[engine]`, with model.sampler_dtype when engine.dtype is empty)."""
    e = cfg.engine
    values = {f.name: getattr(e, f.name) for f in fields(EngineConfig)}
    values["dtype"] = e.dtype or cfg.model.sampler_dtype
    return EngineOptions(**values, log_path=str(log_dir / "vllm-server.log") if log_dir else "")


def add_engine_arguments(parser: argparse.ArgumentParser, device: bool = True, from_config: bool = False) -> None:
    """The engine flags shared by the sampling commands and benchmarks. `from_config`: flags left out fall back
    to the config's `[engine]` (`options_for_command`); otherwise they default to the in-process HF engine on CPU."""
    parser.add_argument("--engine", default=None if from_config else "hf", choices=tuple(BACKENDS),
                        help="inference engine (default: " + ("engine.backend)" if from_config else "hf)"))
    parser.add_argument("--engine-url", default="", help="vllm: attach to this running server instead of "
                                                         "launching one")
    parser.add_argument("--engine-python", default="", help="vllm launch: python of the vLLM environment (default: "
                                                            ".venv-vllm/bin/python when present)")
    parser.add_argument("--engine-arg", action="append", default=[], metavar="ARG",
                        help="vllm launch: one extra `vllm serve` argument (repeatable, e.g. --engine-arg=--seed=1)")
    if device:
        parser.add_argument("--device", default=None if from_config else "cpu", choices=("cpu", "cuda"),
                            help="engine device (default: " + ("engine.device)" if from_config else "cpu)"))


def options_from_args(args: argparse.Namespace, dtype: str | None = None) -> EngineOptions:
    """A benchmark's engine: the `[engine]` defaults with the engine flags on top (`dtype`, else `--dtype`)."""
    return _with_flags(EngineOptions(dtype=dtype or getattr(args, "dtype", None) or SAMPLER_DTYPE), args)


def options_for_command(cfg: Any, args: argparse.Namespace) -> EngineOptions:
    """A command's engine: the config's `[engine]`, with the engine flags given on the command line on top."""
    return _with_flags(options_from_config(cfg), args)


def _with_flags(opts: EngineOptions, args: argparse.Namespace) -> EngineOptions:
    given = {"backend": args.engine, "device": getattr(args, "device", None), "url": args.engine_url or None,
             "python": args.engine_python or None, "extra_args": tuple(args.engine_arg) or None}
    return replace(opts, **{k: v for k, v in given.items() if v is not None})


def _hf(opts: EngineOptions, model: Any, tokenizer: Any, max_batch: int, capture_routing: bool) -> Any:
    from conch.engine.hf import HFEngine

    return HFEngine(model, dtype=opts.dtype, device=opts.device, tokenizer=tokenizer, max_batch=max_batch,
                    capture_routing=capture_routing, **opts.hf_kwargs)


def _vllm(opts: EngineOptions, model: Any, tokenizer: Any, max_batch: int, capture_routing: bool) -> Any:
    from conch.engine.vllm import VLLMEngine

    if not isinstance(model, (str, Path)):
        raise TypeError("the vllm engine serves a checkpoint folder; pass its path, not a model object")
    return VLLMEngine.create(opts, Path(model), tokenizer=tokenizer, max_batch=max_batch,
                             capture_routing=capture_routing)


BACKENDS: dict[str, Callable[..., Any]] = {"hf": _hf, "vllm": _vllm}


def build_engine(opts: EngineOptions, model: Any, *, tokenizer: Any = None, max_batch: int = 64,
                 capture_routing: bool = True, model_dir: str | Path | None = None) -> Any:
    """The engine `opts.backend` names. `model`: a checkpoint folder, or (hf only) a model object; backends that
    serve a folder use `model_dir` when `model` is an object (the trainer's policy and its folder)."""
    factory = BACKENDS.get(opts.backend)
    if factory is None:
        raise ValueError(f"unknown engine backend {opts.backend!r}; known: {', '.join(BACKENDS)}")
    if not opts.dtype:  # [engine] dtype empty: model.sampler_dtype, here its default
        opts = replace(opts, dtype=SAMPLER_DTYPE)
    if opts.backend != "hf" and not isinstance(model, (str, Path)):
        if model_dir is None:
            raise ValueError(f"engine {opts.backend} needs the checkpoint folder (model_dir)")
        model = model_dir
    return factory(opts, model, tokenizer, max_batch, capture_routing)


def with_dtype(opts: EngineOptions, dtype: str) -> EngineOptions:
    return replace(opts, dtype=dtype)
