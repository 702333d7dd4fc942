"""Benchmarks. Each module: `add_arguments(parser)` and `run(args) -> int`; they measure the real code paths."""
