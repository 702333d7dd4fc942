"""The multi-turn terminal agent loop: model turn → tool call → persistent shell → observation → next turn.

One episode = one engine session (its KV cache spans every turn) + one sandbox with one persistent shell. In
`tito` mode the trajectory is built from the exact ids the engine sampled plus the template deltas conch
inserted (see `tito.py`). In `retokenize` mode the whole conversation is re-rendered and re-tokenized every turn
and the engine re-prefills it from scratch, as naive loops do; it exists to measure what TITO saves.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from conch.agent.tito import ChatCodec, TokenBuilder
from conch.agent.toolcall import ToolCallError, parse_turn
from conch.agent.trajectory import StopReason, Trajectory, Turn
from conch.engine.base import Engine, SamplingParams

# Observations must never smuggle control tokens into the sequence.
_SPECIAL_GUARD = ("<|", "<\u200b|")


@dataclass(frozen=True)
class AgentConfig:
    max_turns: int = 300
    max_context: int = 32768  # tokens; also capped by the model's positions
    max_new_tokens: int = 256  # per assistant turn
    obs_token_budget: int = 512  # observation tokens kept (head and tail)
    command_timeout: float = 60.0
    max_parse_errors: int = 3  # consecutive malformed turns before stopping
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    mode: str = "tito"  # or "retokenize"
    agent_timeout: float | None = None  # seconds; None: the task's own


def truncate_tokens(codec: ChatCodec, text: str, budget: int) -> str:
    """Keep the head and tail of `text` within `budget` tokens, with a marker saying how much was cut."""
    ids = codec.encode(text)
    if len(ids) <= budget:
        return text
    half = budget // 2
    head = codec.decode(ids[:half])
    tail = codec.decode(ids[-half:])
    return f"{head}\n[... {len(ids) - 2 * half} tokens truncated ...]\n{tail}"


def observation_text(output: str, exit_code: int | None, timed_out: bool) -> str:
    from conch.tasks.synth.trajectories import format_observation

    text = format_observation(output, exit_code)
    if timed_out:
        text += "\n[command timed out and was interrupted]"
    return text.replace(*_SPECIAL_GUARD)


VerifyHook = Callable[[int], Awaitable[None]]


async def run_episode(
    engine: Engine,
    codec: ChatCodec,
    shell: Any,
    system_prompt: str,
    instruction: str,
    cfg: AgentConfig,
    traj: Trajectory,
    seed: int | None = None,
    agent_timeout: float = 900.0,
    on_turn: VerifyHook | None = None,
) -> Trajectory:
    """Run one episode in an already started shell; fills `traj` (tokens, messages, turns, stop reason).

    `on_turn(turn_index)` is awaited after each executed tool call (reward mode `progress` measures there).
    """
    messages: list[dict] = [{"role": "system", "content": system_prompt}, {"role": "user", "content": instruction}]
    routing_shape = (engine.num_moe_layers, engine.top_k) if engine.num_experts else None
    tb = TokenBuilder(codec, routing_shape)
    tb.insert(codec.encode(codec.render(messages, add_generation_prompt=True)))
    retok = cfg.mode == "retokenize"
    session = await engine.open_session([])
    t0 = time.monotonic()
    parse_errors = 0
    stop = StopReason.MAX_TURNS
    last_call_ids: list[int] = []
    try:
        for turn_idx in range(cfg.max_turns):
            if time.monotonic() - t0 > agent_timeout:
                stop = StopReason.TIMEOUT
                break
            if len(tb.tokens) + cfg.max_new_tokens > cfg.max_context:
                stop = StopReason.CONTEXT
                break
            sampling = SamplingParams(
                temperature=cfg.temperature,
                top_p=cfg.top_p,
                top_k=cfg.top_k,
                max_new_tokens=cfg.max_new_tokens,
                stop_token_ids=codec.stop_ids,
                seed=None if seed is None else seed * 100_003 + turn_idx,
            )
            if retok:
                await engine.close_session(session)
                prompt = codec.encode(codec.render(messages, add_generation_prompt=True))
                session = await engine.open_session(prompt)
                tb.take_pending()
                res = await engine.generate(session, [], sampling)
                last_call_ids = prompt + res.token_ids
            else:
                res = await engine.generate(session, tb.take_pending(), sampling)
                tb.add_routing(res.routed_experts)
            start, end = tb.add_sampled(res.token_ids, res.logprobs)
            turn = Turn(start=start, end=end, finish_reason=res.finish_reason, gen_seconds=res.seconds)
            traj.turns.append(turn)
            text = tb.close_turn(res.token_ids, res.finish_reason)
            if retok:
                turn.sampled_ids = list(res.token_ids)
            try:
                parsed = parse_turn(text)
            except ToolCallError as exc:
                parse_errors += 1
                turn.parse_error = str(exc)
                messages.append({"role": "assistant", "content": text})
                tool_msgs = [{"role": "tool", "content": f"Error: {exc}"}]
                if parse_errors >= cfg.max_parse_errors:
                    stop = StopReason.PARSE_ERRORS
                    break
            else:
                parse_errors = 0
                msg: dict[str, Any] = {"role": "assistant", "content": parsed.content}
                if parsed.calls:
                    msg["tool_calls"] = [c.to_message() for c in parsed.calls]
                messages.append(msg)
                if not retok:
                    tb.check_template(messages, text)
                if not parsed.calls:
                    stop = StopReason.FINISHED
                    break
                if any(c.name == "submit" for c in parsed.calls):
                    stop = StopReason.SUBMITTED
                    break
                tool_msgs = []
                t_env = time.monotonic()
                for call in parsed.calls:
                    remaining = max(1.0, min(cfg.command_timeout, agent_timeout - (time.monotonic() - t0)))
                    r = await shell.run(call.command, timeout=remaining)
                    output = r.stdout + (r.stderr if r.stderr else "")
                    obs = observation_text(truncate_tokens(codec, output, cfg.obs_token_budget), r.exit_code, r.timed_out)
                    tool_msgs.append({"role": "tool", "content": obs})
                    turn.command, turn.exit_code, turn.timed_out = call.command, r.exit_code, r.timed_out
                turn.env_seconds = time.monotonic() - t_env
                if on_turn is not None:
                    await on_turn(turn_idx)
            with_assistant = list(messages)
            messages.extend(tool_msgs)
            if not retok:
                tb.insert(tb.observation_ids(with_assistant, messages))
    except Exception as exc:  # engine or sandbox failure: keep what we have, say why
        stop = StopReason.ERROR
        traj.error = f"{type(exc).__name__}: {exc}"
    finally:
        await engine.close_session(session)
    traj.stop_reason = stop
    traj.messages = messages
    traj.drift.update(tb.drift)
    traj.timings["episode_seconds"] = time.monotonic() - t0
    if retok:
        _finish_retokenized(traj, tb, codec, messages, last_call_ids)
    else:
        traj.tokens, traj.mask, traj.logprobs = tb.tokens, tb.mask, tb.logprobs
        traj.routed_experts = tb.routed_experts()
    return traj


def _finish_retokenized(traj: Trajectory, tb: TokenBuilder, codec: ChatCodec, messages: list[dict], last_ids: list[int]) -> None:
    """Naive-loop trajectory: the final conversation re-rendered and re-tokenized. Assistant turns are masked in
    where their re-tokenized ids can be located; sampler log-probs are copied only where the ids are identical
    (elsewhere the per-turn comparison in `Turn.sampled_ids` is what can be compared)."""
    tokens = codec.encode(codec.render(messages, add_generation_prompt=False))
    mask = [0] * len(tokens)
    logprobs = [0.0] * len(tokens)
    cursor = 0
    for turn in traj.turns:
        sampled = turn.sampled_ids or []
        body = sampled[:-1] if sampled and sampled[-1] in codec.stop_ids else sampled
        # Find the turn's sampled ids in the re-tokenized sequence, scanning forward.
        n = len(body)
        found = -1
        for i in range(cursor, len(tokens) - n + 1):
            if tokens[i : i + n] == body:
                found = i
                break
        if n and found >= 0:
            lp = tb.logprobs[turn.start : turn.start + n]
            for j in range(n):
                mask[found + j] = 1
                logprobs[found + j] = lp[j]
            turn.start, turn.end = found, found + n
            cursor = found + n
        else:
            turn.start = turn.end = -1
    traj.tokens, traj.mask, traj.logprobs = tokens, mask, logprobs
    traj.routed_experts = None
