"""Warm start, step 1: supervised fine-tuning on expert trajectories, loss on assistant tokens only.

Why build the examples with the agent loop's own token bookkeeping: the policy must learn to emit exactly the
ids the rollouts will later hold. Each expert chat is laid out as the TITO loop lays out a rollout — prompt ids,
then per turn the canonical ids of the assistant text plus its end token (mask 1), then the chat-template delta
of the observation (mask 0) — so SFT, rollouts and PPO share one token layout.

Training runs at a constant learning rate (after a linear warm-up) until the validation loss stops improving for
`patience` evaluations; at such a plateau it goes back to the best weights and cuts the learning rate, `max_cuts`
times; the next plateau (or the step budget) ends it. Why not a cosine schedule over a fixed budget: the loss then
flattens because the learning rate reaches zero, not because the model has learned what the data holds, and where
that happens depends on the budget; the curve is returned so the run can report it.
"""

from __future__ import annotations

import math
import random
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

from conch.agent.tito import END_OF_TURN, ChatCodec, TokenBuilder
from conch.rl.plateau import Plateau


@dataclass
class SFTExample:
    tokens: list[int]
    mask: list[int]


@dataclass
class SFTReport:
    steps: int
    train_loss: list[tuple[int, float]] = field(default_factory=list)
    val_loss: list[tuple[int, float]] = field(default_factory=list)
    best_val: float = math.inf
    stopped: str = "budget"  # "plateau" or "budget"
    lr_cuts: list[int] = field(default_factory=list)  # steps at which a plateau cut the learning rate
    seconds: float = 0.0
    examples: int = 0
    val_examples: int = 0


def build_example(codec: ChatCodec, messages: Sequence[dict], max_tokens: int) -> SFTExample:
    """Lay out one expert chat (system, user, assistant/tool turns) exactly as a TITO rollout would."""
    tb = TokenBuilder(codec, routing_shape=None)
    convo = list(messages[:2])
    tb.insert(codec.encode(codec.render(convo, add_generation_prompt=True)))
    i = 2
    while i < len(messages):
        msg = messages[i]
        if msg["role"] != "assistant":
            raise ValueError(f"expected an assistant message at position {i}, got {msg['role']!r}")
        before = codec.render(convo, add_generation_prompt=True)
        convo.append(msg)
        after = codec.render(convo, add_generation_prompt=False)
        segment = after[len(before) :]
        text = segment[: segment.index(END_OF_TURN)] if END_OF_TURN in segment else segment
        ids = codec.encode(text) + [codec.end_id]
        tb.add_sampled(ids, [0.0] * len(ids))
        i += 1
        obs = []
        while i < len(messages) and messages[i]["role"] == "tool":
            obs.append(messages[i])
            i += 1
        if obs:
            with_assistant = list(convo)
            convo.extend(obs)
            tb.insert(tb.observation_ids(with_assistant, convo))
        if 0 < max_tokens <= len(tb.tokens):
            break
    cap = max_tokens if max_tokens > 0 else None  # 0: uncut (callers pass conch.model.context.context_length)
    return SFTExample(tb.tokens[:cap], tb.mask[:cap])


def _batch_loss(model: Any, batch: list[SFTExample], pad_id: int):
    import torch
    import torch.nn.functional as F

    T = max(len(e.tokens) for e in batch)
    ids = torch.full((len(batch), T), pad_id, dtype=torch.long)
    mask = torch.zeros((len(batch), T), dtype=torch.float32)
    attn = torch.zeros((len(batch), T), dtype=torch.long)
    for b, e in enumerate(batch):
        n = len(e.tokens)
        ids[b, :n] = torch.tensor(e.tokens)
        mask[b, :n] = torch.tensor(e.mask, dtype=torch.float32)
        attn[b, :n] = 1
    logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
    targets = ids[:, 1:]
    m = mask[:, 1:]
    nll = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="none")
    nll = nll.view_as(m)
    return (nll * m).sum() / m.sum().clamp(min=1.0)


def train_sft(
    model: Any,
    examples: list[SFTExample],
    pad_id: int,
    steps: int,
    lr: float,
    batch_size: int,
    val_fraction: float = 0.1,
    eval_every: int = 25,
    patience: int = 4,
    max_cuts: int = 2,
    lr_cut: float = 0.3,
    min_delta: float = 1e-3,
    seed: int = 0,
    log: Any = None,
    on_step: Any = None,
) -> SFTReport:
    """Train `model` in place; keeps the weights of the best validation loss. `on_step(step, metrics)` gets
    `sft/loss` and `sft/lr` every step, plus `sft/val_loss` at validation steps."""
    import copy

    import torch

    rng = random.Random(seed)
    order = list(range(len(examples)))
    rng.shuffle(order)
    n_val = max(1, int(len(examples) * val_fraction)) if len(examples) > 4 else 0
    val = [examples[i] for i in order[:n_val]]
    train = [examples[i] for i in order[n_val:]] or val
    report = SFTReport(steps=0, examples=len(train), val_examples=len(val))
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, betas=(0.9, 0.95))
    warmup = min(20, max(1, steps // 10))
    plateau = Plateau(patience=patience, max_cuts=max_cuts, lr_cut=lr_cut, min_delta=min_delta)
    best_state = None
    t0 = time.monotonic()
    model.train()

    def val_loss() -> float:
        model.eval()
        with torch.no_grad():
            losses = [float(_batch_loss(model, val[i : i + batch_size], pad_id)) for i in range(0, len(val), batch_size)]
        model.train()
        return sum(losses) / len(losses)

    for step in range(1, steps + 1):
        for group in opt.param_groups:
            group["lr"] = lr * plateau.scale * min(1.0, step / warmup)
        batch = [train[rng.randrange(len(train))] for _ in range(batch_size)]
        loss = _batch_loss(model, batch, pad_id)
        loss_value = loss.item()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        report.steps = step
        report.train_loss.append((step, loss_value))
        step_metrics = {"sft/loss": loss_value, "sft/lr": opt.param_groups[0]["lr"]}
        validate = bool(val) and (step % eval_every == 0 or step == steps)
        if on_step is not None and not validate:
            on_step(step, step_metrics)
        if validate:
            v = val_loss()
            report.val_loss.append((step, v))
            step_metrics["sft/val_loss"] = v
            if log is not None:
                log(step, loss_value, v)
            else:
                print(f"sft step {step}/{steps}  lr {lr * plateau.scale:.2e}  train {loss_value:.3f}  val {v:.3f}",
                      file=sys.stderr, flush=True)
            action = plateau.observe(v)
            step_metrics["sft/lr_cut"] = action == "cut"
            if on_step is not None:
                on_step(step, step_metrics)
            if action == "best":
                best_state = copy.deepcopy(model.state_dict())
            elif action == "cut":
                if best_state is not None:
                    model.load_state_dict(best_state)
                report.lr_cuts.append(step)
            elif action == "stop":
                report.stopped = "plateau"
                break
    report.best_val = plateau.best
    if best_state is not None:
        model.load_state_dict(best_state)
    model.eval()
    report.seconds = time.monotonic() - t0
    return report
