"""The multi-turn terminal agent loop: model turn → tool call → persistent shell → observation → next turn.

One episode = one engine session (its KV cache spans every turn) + one sandbox with one persistent shell. In
`tito` mode the trajectory is built from the exact ids the engine sampled plus the template deltas conch
inserted (see `tito.py`). In `retokenize` mode the whole conversation is re-rendered and re-tokenized every turn
and the engine re-prefills it from scratch, as naive loops do; it exists to measure what TITO saves. The two
modes are two token strategies (`TitoTokens`, `RetokenizeTokens`) under one loop: both run the same drift
checks on the same bookkeeping, so their drift counts compare directly, and with no drift their token
sequences are identical.

The loop takes the config's `[agent]` section (`conch.config.AgentLoopConfig`) itself: there is no second
agent config type. A subclass may override `AgentLoop.idle_call` (what a turn without a runnable tool call
runs instead of ending the episode); production never does, benchmarks do (conch/bench/agents.py).
"""

from __future__ import annotations

import time
from typing import Any, Awaitable, Callable

from conch.agent.tito import ChatCodec, TokenBuilder, assistant_bodies
from conch.agent.toolcall import ToolCall, ToolCallError, parse_turn
from conch.agent.trajectory import StopReason, Trajectory, Turn
from conch.config import AgentLoopConfig
from conch.engine.base import Engine, GenerateResult, SamplingParams

MODES = ("tito", "retokenize")


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


def context_limit(engine: Engine, cfg: AgentLoopConfig) -> int:
    from conch.model.context import context_length

    return context_length(cfg.max_context, getattr(engine, "max_positions", None))


class TitoTokens:
    """Token-in, token-out: one engine session for the whole episode, fed only the ids conch inserted."""

    def __init__(self, engine: Engine, codec: ChatCodec, tb: TokenBuilder) -> None:
        self.engine, self.codec, self.tb = engine, codec, tb
        self.session: int | None = None

    async def open(self) -> None:
        self.session = await self.engine.open_session([])

    def prompt_length(self, messages: list[dict]) -> int:
        return len(self.tb.tokens)

    async def generate(self, sampling: SamplingParams) -> GenerateResult:
        res = await self.engine.generate(self.session, self.tb.take_pending(), sampling)
        self.tb.add_routing(res.routed_experts)
        return res

    def record(self, turn: Turn, res: GenerateResult) -> None:
        pass

    async def close(self) -> None:
        if self.session is not None:
            await self.engine.close_session(self.session)
            self.session = None

    def finish(self, traj: Trajectory, messages: list[dict]) -> None:
        traj.tokens, traj.mask, traj.logprobs = self.tb.tokens, self.tb.mask, self.tb.logprobs
        traj.routed_experts = self.tb.routed_experts()


class RetokenizeTokens(TitoTokens):
    """The naive loop: the conversation re-rendered and re-tokenized every turn, re-prefilled in a fresh session."""

    def __init__(self, engine: Engine, codec: ChatCodec, tb: TokenBuilder) -> None:
        super().__init__(engine, codec, tb)
        self.prompt: list[int] = []

    async def open(self) -> None:
        pass  # a session per turn, opened in `generate`

    def prompt_length(self, messages: list[dict]) -> int:
        self.prompt = self.codec.encode(self.codec.render(messages, add_generation_prompt=True))
        return len(self.prompt)

    async def generate(self, sampling: SamplingParams) -> GenerateResult:
        self.tb.take_pending()  # kept in the bookkeeping (drift checks), never fed: the prompt is re-tokenized
        await self.close()
        self.session = await self.engine.open_session(self.prompt)
        return await self.engine.generate(self.session, [], sampling)

    def record(self, turn: Turn, res: GenerateResult) -> None:
        turn.sampled_ids = list(res.token_ids)

    def finish(self, traj: Trajectory, messages: list[dict]) -> None:
        _finish_retokenized(traj, self.tb, self.codec, messages)


TOKEN_STRATEGIES = {"tito": TitoTokens, "retokenize": RetokenizeTokens}


class AgentLoop:
    """One episode in an already started shell; `run()` fills `traj` (tokens, messages, turns, stop reason).

    `on_turn(turn_index)` is awaited after each executed tool call (reward mode `progress` measures there).
    Engine and shell failures end the episode with StopReason.ERROR and `traj.error`; nothing is raised.
    """

    def __init__(self, engine: Engine, codec: ChatCodec, shell: Any, system_prompt: str, instruction: str,
                 cfg: AgentLoopConfig, traj: Trajectory, seed: int | None = None, agent_timeout: float = 900.0,
                 on_turn: VerifyHook | None = None) -> None:
        if cfg.mode not in MODES:
            raise ValueError(f"agent.mode must be one of {', '.join(MODES)}, got {cfg.mode!r}")
        self.engine, self.codec, self.shell, self.cfg, self.traj = engine, codec, shell, cfg, traj
        self.seed, self.agent_timeout, self.on_turn = seed, agent_timeout, on_turn
        self.messages: list[dict] = [{"role": "system", "content": system_prompt},
                                     {"role": "user", "content": instruction}]
        routing_shape = (engine.num_moe_layers, engine.top_k) if engine.num_experts else None
        self.tb = TokenBuilder(codec, routing_shape)
        self.tb.insert(codec.encode(codec.render(self.messages, add_generation_prompt=True)))
        self.tokens = TOKEN_STRATEGIES[cfg.mode](engine, codec, self.tb)
        self.parse_errors = 0
        self.t0 = time.monotonic()

    def idle_call(self) -> ToolCall | None:
        """What a turn without a runnable tool call runs instead of ending the episode: nothing (it ends)."""
        return None

    async def run(self) -> Trajectory:
        cfg, traj, tb = self.cfg, self.traj, self.tb
        limit = context_limit(self.engine, cfg)
        self.t0 = time.monotonic()
        stop: StopReason | None = StopReason.MAX_TURNS
        try:
            await self.tokens.open()
            for turn_idx in range(cfg.max_turns):
                if time.monotonic() - self.t0 > self.agent_timeout:
                    stop = StopReason.TIMEOUT
                    break
                if self.tokens.prompt_length(self.messages) + cfg.max_new_tokens > limit:
                    stop = StopReason.CONTEXT
                    break
                stop = await self.turn(turn_idx)
                if stop is not None:
                    break
            else:
                stop = StopReason.MAX_TURNS
        except Exception as exc:  # engine or sandbox failure: keep what we have, say why
            stop = StopReason.ERROR
            traj.error = f"{type(exc).__name__}: {exc}"
        finally:
            await self.tokens.close()
        traj.stop_reason = stop
        traj.messages = self.messages
        traj.timings["episode_seconds"] = time.monotonic() - self.t0
        if stop != StopReason.ERROR:
            tb.close_episode(self.messages)
            if traj.turns:
                traj.turns[-1].drift += tb.take_turn_drift()
        traj.drift.update(tb.drift)
        self.tokens.finish(traj, self.messages)
        return traj

    async def turn(self, turn_idx: int) -> StopReason | None:
        """One assistant turn and its tool calls; the reason the episode stops here, or None."""
        cfg, tb = self.cfg, self.tb
        sampling = SamplingParams(temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k,
                                  max_new_tokens=cfg.max_new_tokens, stop_token_ids=self.codec.stop_ids,
                                  seed=None if self.seed is None else self.seed * 100_003 + turn_idx)
        res = await self.tokens.generate(sampling)
        start, end = tb.add_sampled(res.token_ids, res.logprobs)
        turn = Turn(start=start, end=end, finish_reason=res.finish_reason, gen_seconds=res.seconds)
        self.traj.turns.append(turn)
        self.tokens.record(turn, res)
        text = tb.close_turn(res.token_ids, res.finish_reason)
        calls, tool_msgs, stop = self.parse(text, turn)
        if not calls and stop != StopReason.SUBMITTED:
            idle = self.idle_call()
            if idle is not None:
                calls, tool_msgs, stop = (idle,), [], None
        if stop is not None:
            turn.drift = tb.take_turn_drift()
            return stop
        if calls:
            await self.execute(calls, turn, tool_msgs)
            if self.on_turn is not None:
                await self.on_turn(turn_idx)
        with_assistant = list(self.messages)
        self.messages.extend(tool_msgs)
        tb.insert(tb.observation_ids(with_assistant, self.messages))
        turn.drift = tb.take_turn_drift()
        return None

    def parse(self, text: str, turn: Turn) -> tuple[tuple[ToolCall, ...], list[dict], StopReason | None]:
        """(tool calls, tool messages so far, stop reason or None) of a turn's text; appends the assistant message."""
        try:
            parsed = parse_turn(text)
        except ToolCallError as exc:
            self.parse_errors += 1
            turn.parse_error = str(exc)
            self.messages.append({"role": "assistant", "content": self.codec.neutralize(text)})
            stop = StopReason.PARSE_ERRORS if self.parse_errors >= self.cfg.max_parse_errors else None
            return (), [{"role": "tool", "content": f"Error: {exc}"}], stop
        self.parse_errors = 0
        msg: dict[str, Any] = {"role": "assistant", "content": self.codec.neutralize(parsed.content)}
        if parsed.calls:
            msg["tool_calls"] = [c.to_message() for c in parsed.calls]
        self.messages.append(msg)
        self.tb.check_template(self.messages, text)
        if any(c.name == "submit" for c in parsed.calls):
            return parsed.calls, [], StopReason.SUBMITTED
        return parsed.calls, [], None if parsed.calls else StopReason.FINISHED

    async def execute(self, calls: tuple[ToolCall, ...], turn: Turn, tool_msgs: list[dict]) -> None:
        """Run each call in the shell; its observation goes to `tool_msgs`, its outcome to `turn`."""
        cfg, codec = self.cfg, self.codec
        t_env = time.monotonic()
        for call in calls:
            remaining = max(1.0, min(cfg.command_timeout, self.agent_timeout - (time.monotonic() - self.t0)))
            r = await self.shell.run(call.command, timeout=remaining)
            output = r.stdout + (r.stderr if r.stderr else "")
            obs = observation_text(codec, truncate_tokens(codec, output, cfg.obs_token_budget), r.exit_code,
                                   r.timed_out)
            tool_msgs.append({"role": "tool", "content": obs})
            turn.command, turn.exit_code, turn.timed_out = call.command, r.exit_code, r.timed_out
        turn.env_seconds = time.monotonic() - t_env


async def run_loop(engine: Engine, codec: ChatCodec, shell: Any, system_prompt: str, instruction: str,
                   cfg: AgentLoopConfig, traj: Trajectory, seed: int | None = None, agent_timeout: float = 900.0,
                   on_turn: VerifyHook | None = None, loop: type[AgentLoop] = AgentLoop) -> Trajectory:
    """`loop(...).run()`: one episode in an already started shell (see `AgentLoop`)."""
    return await loop(engine, codec, shell, system_prompt, instruction, cfg, traj, seed=seed,
                      agent_timeout=agent_timeout, on_turn=on_turn).run()


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

