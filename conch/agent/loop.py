"""The multi-turn terminal agent loop: model turn → tool call → persistent shell → observation → next turn.

One episode = one engine session (its KV cache spans every turn) + one sandbox with one persistent shell. In
`tito` mode the trajectory is built from the exact ids the engine sampled plus the template deltas conch
inserted (see `tito.py`). In `retokenize` mode the whole conversation is re-rendered and re-tokenized every turn
and the engine re-prefills it from scratch, as naive loops do; it exists to measure what TITO saves. Both modes
run the same drift checks on the same bookkeeping, so their drift counts compare directly, and with no drift
their token sequences are identical.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from conch.agent.tito import ChatCodec, TokenBuilder, assistant_bodies
from conch.agent.toolcall import ToolCall, ToolCallError, parse_turn
from conch.agent.trajectory import StopReason, Trajectory, Turn
from conch.engine.base import Engine, SamplingParams

MODES = ("tito", "retokenize")


@dataclass(frozen=True)
class AgentConfig:
    max_turns: int = 300
    max_context: int = 32768  # tokens (0: the engine's `max_positions`); never above the engine's `max_positions`
    max_new_tokens: int = 256  # per assistant turn
    obs_token_budget: int = 512  # observation tokens kept (head and tail)
    command_timeout: float = 60.0
    max_parse_errors: int = 3  # consecutive malformed turns before stopping
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    mode: str = "tito"  # or "retokenize"
    agent_timeout: float | None = None  # seconds; None: the task's own
    # Benchmarks only: a turn without a runnable tool call runs this command instead of ending the episode (a
    # randomly initialised model never emits tool calls). The turn's ids are still exactly what was sampled.
    fallback_command: str | None = None


def truncate_tokens(codec: ChatCodec, text: str, budget: int) -> str:
    """Keep the head and tail of `text` within `budget` tokens, with a marker saying how much was cut."""
    ids = codec.encode(text)
    if len(ids) <= budget:
        return text
    half = budget // 2
    head = codec.decode(ids[:half])
    tail = codec.decode(ids[-half:])
    return f"{head}\n[... {len(ids) - 2 * half} tokens truncated ...]\n{tail}"


def observation_text(codec: ChatCodec, output: str, exit_code: int | None, timed_out: bool) -> str:
    """The tool message: output and exit code (the synthesizer's format, so SFT and RL see the same text)."""
    from conch.tasks.synth.trajectories import format_observation

    text = format_observation(output, exit_code)
    if timed_out:
        text += "\n[command timed out and was interrupted]"
    return codec.neutralize(text)


VerifyHook = Callable[[int], Awaitable[None]]


def context_limit(engine: Engine, cfg: AgentConfig) -> int:
    from conch.model.context import context_length

    return context_length(cfg.max_context, getattr(engine, "max_positions", None))


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
    Engine and shell failures end the episode with StopReason.ERROR and `traj.error`; nothing is raised.
    """
    if cfg.mode not in MODES:
        raise ValueError(f"AgentConfig.mode must be one of {', '.join(MODES)}, got {cfg.mode!r}")
    messages: list[dict] = [{"role": "system", "content": system_prompt}, {"role": "user", "content": instruction}]
    routing_shape = (engine.num_moe_layers, engine.top_k) if engine.num_experts else None
    tb = TokenBuilder(codec, routing_shape)
    tb.insert(codec.encode(codec.render(messages, add_generation_prompt=True)))
    retok = cfg.mode == "retokenize"
    limit = context_limit(engine, cfg)
    session: int | None = None
    t0 = time.monotonic()
    parse_errors = 0
    stop = StopReason.MAX_TURNS
    try:
        if not retok:
            session = await engine.open_session([])
        for turn_idx in range(cfg.max_turns):
            if time.monotonic() - t0 > agent_timeout:
                stop = StopReason.TIMEOUT
                break
            prompt = codec.encode(codec.render(messages, add_generation_prompt=True)) if retok else None
            if (len(prompt) if retok else len(tb.tokens)) + cfg.max_new_tokens > limit:
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
            fed = tb.take_pending()
            if retok:  # the naive loop: a fresh session over the re-tokenized conversation every turn
                if session is not None:
                    await engine.close_session(session)
                    session = None
                session = await engine.open_session(prompt)
                res = await engine.generate(session, [], sampling)
            else:
                res = await engine.generate(session, fed, sampling)
                tb.add_routing(res.routed_experts)
            start, end = tb.add_sampled(res.token_ids, res.logprobs)
            turn = Turn(start=start, end=end, finish_reason=res.finish_reason, gen_seconds=res.seconds)
            traj.turns.append(turn)
            if retok:
                turn.sampled_ids = list(res.token_ids)
            text = tb.close_turn(res.token_ids, res.finish_reason)
            calls: tuple[ToolCall, ...] = ()
            content = codec.neutralize(text)
            try:
                parsed = parse_turn(text)
            except ToolCallError as exc:
                parse_errors += 1
                turn.parse_error = str(exc)
                messages.append({"role": "assistant", "content": content})
                tool_msgs = [{"role": "tool", "content": f"Error: {exc}"}]
                if parse_errors >= cfg.max_parse_errors and cfg.fallback_command is None:
                    turn.drift = tb.take_turn_drift()
                    stop = StopReason.PARSE_ERRORS
                    break
            else:
                parse_errors = 0
                msg: dict[str, Any] = {"role": "assistant", "content": codec.neutralize(parsed.content)}
                if parsed.calls:
                    msg["tool_calls"] = [c.to_message() for c in parsed.calls]
                messages.append(msg)
                tb.check_template(messages, text)
                calls = parsed.calls
                tool_msgs = []
                if any(c.name == "submit" for c in calls):
                    turn.drift = tb.take_turn_drift()
                    stop = StopReason.SUBMITTED
                    break
                if not calls and cfg.fallback_command is None:
                    turn.drift = tb.take_turn_drift()
                    stop = StopReason.FINISHED
                    break
            if not calls and cfg.fallback_command is not None:
                calls, tool_msgs = (ToolCall("bash", cfg.fallback_command),), []
            if calls:
                t_env = time.monotonic()
                for call in calls:
                    remaining = max(1.0, min(cfg.command_timeout, agent_timeout - (time.monotonic() - t0)))
                    r = await shell.run(call.command, timeout=remaining)
                    output = r.stdout + (r.stderr if r.stderr else "")
                    obs = observation_text(codec, truncate_tokens(codec, output, cfg.obs_token_budget), r.exit_code,
                                           r.timed_out)
                    tool_msgs.append({"role": "tool", "content": obs})
                    turn.command, turn.exit_code, turn.timed_out = call.command, r.exit_code, r.timed_out
                turn.env_seconds = time.monotonic() - t_env
                if on_turn is not None:
                    await on_turn(turn_idx)
            with_assistant = list(messages)
            messages.extend(tool_msgs)
            tb.insert(tb.observation_ids(with_assistant, messages))
            turn.drift = tb.take_turn_drift()
    except Exception as exc:  # engine or sandbox failure: keep what we have, say why
        stop = StopReason.ERROR
        traj.error = f"{type(exc).__name__}: {exc}"
    finally:
        if session is not None:
            await engine.close_session(session)
    traj.stop_reason = stop
    traj.messages = messages
    traj.timings["episode_seconds"] = time.monotonic() - t0
    if stop != StopReason.ERROR:
        tb.close_episode(messages)
        if traj.turns:
            traj.turns[-1].drift += tb.take_turn_drift()
    traj.drift.update(tb.drift)
    if retok:
        _finish_retokenized(traj, tb, codec, messages)
    else:
        traj.tokens, traj.mask, traj.logprobs = tb.tokens, tb.mask, tb.logprobs
        traj.routed_experts = tb.routed_experts()
    return traj


def _finish_retokenized(traj: Trajectory, tb: TokenBuilder, codec: ChatCodec, messages: list[dict]) -> None:
    """The naive loop's trajectory: the final conversation re-rendered and re-tokenized, every assistant turn's
    rendered body (through its end token) masked in. A turn's sampler log-probs are copied for the leading ids
    that equal the sampled ones; past the first difference the naive loop has no log-prob (0.0). Routing is not
    kept (the engine re-prefilled a different sequence every turn)."""
    text = codec.render(messages, add_generation_prompt=bool(messages) and messages[-1]["role"] == "tool")
    enc = codec.tok(text, add_special_tokens=False, return_offsets_mapping=True)
    tokens, offsets = list(enc["input_ids"]), list(enc["offset_mapping"])
    mask = [0] * len(tokens)
    logprobs = [0.0] * len(tokens)
    spans = assistant_bodies(text)
    i = 0
    for k, turn in enumerate(traj.turns):
        if k >= len(spans):
            turn.start = turn.end = -1
            continue
        a, b = spans[k]
        while i < len(tokens) and offsets[i][0] < a:
            i += 1
        start = i
        while i < len(tokens) and offsets[i][0] < b:
            mask[i] = 1
            i += 1
        sampled = turn.sampled_ids or []
        lp = tb.logprobs[turn.start : turn.start + len(sampled)]
        for j in range(min(i - start, len(sampled))):
            if tokens[start + j] != sampled[j]:
                break
            logprobs[start + j] = lp[j]
        turn.start, turn.end = start, i
    traj.tokens, traj.mask, traj.logprobs = tokens, mask, logprobs
    traj.routed_experts = None

