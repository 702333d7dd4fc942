"""conch.model: policy models and tokenizers.

- `init.py`: create conch's own randomly initialised Qwen3-MoE model + tokenizer (`conch model init`).
- `tokenizer.py` (+ `corpus.py`, `chat_template.jinja`): offline byte-level BPE, special tokens, chat template.
- `loading.py`: load any local HF checkpoint folder (model + tokenizer, dtype, MoE detection).
Heavy imports (torch, transformers) happen inside functions, so importing this package is cheap.
"""
