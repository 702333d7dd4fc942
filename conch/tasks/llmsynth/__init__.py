"""LLM task synthesis: a strong model writes new Harbor tasks from seed tasks; only the ones that work are kept.

Why a pipeline of gates: an LLM's task is a claim ("this solution passes these tests, doing nothing does not"),
and most claims are false. Every candidate goes through the same gates, in order, each outcome recorded in
the `synth.jsonl` ledger: parses -> loads -> image builds -> oracle passes every test -> nop fails at least
one -> the instruction does not give the solution away -> not flagged by decontamination against a benchmark
-> not a near-duplicate of a seed or an accepted task. A failing gate's message can go back to the model for
a repair (`--repairs K`).

Modules: `prompts` (versioned templates under prompts/<version>/), `client` (OpenAI-compatible chat over
plain HTTP), `parse` (answer -> task folder), `gates`, `ledger` (append-only JSONL, resume, stats), `runner`
(concurrency, retries, progress). Heavy imports (sandboxes, decontamination) happen inside functions.
"""

PROMPT_VERSION = "v1"
