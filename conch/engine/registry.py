"""The engine registry: one config key (`engine.backend`) picks the inference engine every sampling command uses.

Why a registry: `train`, `eval`, `rollout` and the benchmarks must sample with the same engine a user chose (the
in-process HF engine on a laptop, a vLLM server for a real checkpoint on a GPU) without each of them knowing how
an engine is built. Each backend is one factory here; commands pass plain `EngineOptions` and get an object that
satisfies `conch.engine.base.Engine`. A new backend (e.g. "sglang") is one more entry in `BACKENDS`.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable


@dataclass(frozen=True)
class EngineOptions:
    """Plain data that says which engine to build and how (from `[engine]` of the config or from CLI flags)."""

    backend: str = "hf"
    device: str = "cpu"
    dtype: str = "float32"
    url: str = ""  # vllm: attach to this server
    launch: bool = True  # vllm without url: start a server subprocess
    python: str = ""  # vllm launch: interpreter of the vLLM environment
    port: int = 0
    startup_timeout: float = 600.0
    extra_args: tuple[str, ...] = ()
    log_path: str = ""  # vllm launch: where the server's log goes (empty: a temporary file)
    hf_kwargs: dict = field(default_factory=dict)  # hf only: e.g. native_attention, torch_threads


def options_from_config(cfg: Any, log_dir: Path | None = None) -> EngineOptions:
    """EngineOptions from a root `Config` (`[engine]`, with model.sampler_dtype when engine.dtype is empty)."""
    e = cfg.engine
    return EngineOptions(backend=e.backend, device=e.device, dtype=e.dtype or cfg.model.sampler_dtype, url=e.url,
                         launch=e.launch, python=e.python, port=e.port, startup_timeout=e.startup_timeout,
                         extra_args=tuple(str(a) for a in e.extra_args),
                         log_path=str(log_dir / "vllm-server.log") if log_dir else "")


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
    return EngineOptions(backend=args.engine or "hf", device=getattr(args, "device", None) or "cpu",
                         dtype=dtype or getattr(args, "dtype", "float32"), url=args.engine_url,
                         python=args.engine_python, extra_args=tuple(args.engine_arg))


def options_for_command(cfg: Any, args: argparse.Namespace) -> EngineOptions:
    """A command's engine: the config's `[engine]`, with the engine flags given on the command line on top."""
    opts = options_from_config(cfg)
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
    if opts.backend != "hf" and not isinstance(model, (str, Path)):
        if model_dir is None:
            raise ValueError(f"engine {opts.backend} needs the checkpoint folder (model_dir)")
        model = model_dir
    return factory(opts, model, tokenizer, max_batch, capture_routing)


def with_dtype(opts: EngineOptions, dtype: str) -> EngineOptions:
    return replace(opts, dtype=dtype)
