"""Harbor's Agent Trajectory Interchange Format (ATIF): export conch trajectories, import ATIF as chat messages.

Why: Harbor's viewer and the Terminal-Bench leaderboard tooling read ATIF; exporting lets them read conch runs,
and importing lets trajectories recorded by other agents (any ATIF producer) become SFT data for conch.

The models are harbor's own (`harbor.models.trajectories`, harbor==0.25.0, ATIF-v1.8), so what is written is
validated by the schema's owner. harbor 0.25 declares Python >= 3.12 and a server stack (litellm, fastapi,
supabase, ...) that conch does not need; its trajectory models need only pydantic, so conch installs the
wheel with `--no-deps --ignore-requires-python` (Makefile) and imports only those models.

Mapping (one conch record -> one ATIF trajectory):
- system and user messages -> steps with source "system" / "user";
- each assistant turn -> an "agent" step: its text as `message`, its bash calls as `tool_calls`
  (`call_<turn>_<k>`), the shell's answers as `observation.results` (tool messages after a turn without a valid
  call, e.g. a parse error, have no `source_call_id`), the sampled token ids and sampler log-probs of the
  turn in `metrics`, exit code and timings in `extra`;
- reward, per-test outcomes, stop reason and errors -> the trajectory's `extra` and `final_metrics.extra`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

ATIF_AGENT = "conch"


def _harbor():
    try:
        from harbor.models import trajectories as m
    except ImportError:
        raise RuntimeError("ATIF needs harbor's trajectory models: pip install --no-deps --ignore-requires-python "
                           "harbor==0.25.0 (conch uses only harbor.models.trajectories, which needs pydantic)") from None
    return m


def _turn_metrics(m: Any, record: dict, step: dict) -> Any:
    span = step.get("span")
    if not span or not record.get("tokens"):
        return None
    a, b = span
    mask = record["mask"][a:b]
    ids = [t for t, k in zip(record["tokens"][a:b], mask) if k == 1]
    lps = [lp for lp, k in zip(record["sampler_lp"][a:b], mask) if k == 1]
    return m.Metrics(completion_tokens=len(ids), completion_token_ids=ids, logprobs=lps)


def _group(record: dict) -> str:
    """Where a record belongs, as a clean token: `eval-final`, `ppo-iter0003` (`ppo` without an iteration),
    `rollout-NAME`; also the export's folder name."""
    stage, name, it = record.get("stage") or "trajectory", record.get("name"), record.get("iteration")
    if stage == "ppo":
        return "ppo" if it is None else f"ppo-iter{int(it):04d}"
    return _id(stage, name if name != stage else None)


def _id(*parts: Any) -> str:
    """Parts joined by '-', the missing ones (None, '') left out: never a Python repr such as `None` in an id."""
    return "-".join(str(p) for p in parts if p is not None and str(p) != "")


def to_atif(record: dict, model_name: str | None = None) -> Any:
    """One kept-trajectory record (`store.make_record`) as a validated `harbor.models.trajectories.Trajectory`."""
    from conch import __version__

    m = _harbor()
    steps: list[Any] = []
    turn_info = record.get("steps", [])
    msgs = record["messages"]
    turn = -1
    i = 0
    while i < len(msgs):
        msg = msgs[i]
        role, content = msg.get("role"), msg.get("content") or ""
        if role in ("system", "user"):
            steps.append(m.Step(step_id=len(steps) + 1, source=role, message=content))
            i += 1
            continue
        if role != "assistant":  # a tool message with no assistant turn before it: keep it as a system event
            steps.append(m.Step(step_id=len(steps) + 1, source="system", message=content, extra={"role": role}))
            i += 1
            continue
        turn += 1
        calls = [m.ToolCall(tool_call_id=f"call_{turn}_{k}", function_name=c["function"]["name"],
                            arguments=c["function"].get("arguments") or {})
                 for k, c in enumerate(msg.get("tool_calls") or [])]
        i += 1
        results = []
        k = 0
        while i < len(msgs) and msgs[i].get("role") == "tool":
            source = calls[k].tool_call_id if k < len(calls) else None
            results.append(m.ObservationResult(source_call_id=source, content=msgs[i].get("content") or ""))
            k += 1
            i += 1
        info = turn_info[turn] if turn < len(turn_info) else {}
        extra = {k2: info.get(k2) for k2 in ("exit_code", "timed_out", "parse_error", "gen_s", "env_s", "finish")
                 if info.get(k2) is not None}
        steps.append(m.Step(step_id=len(steps) + 1, source="agent", message=content, model_name=None,
                            tool_calls=calls or None, observation=m.Observation(results=results) if results else None,
                            metrics=_turn_metrics(m, record, info) if info else None, extra=extra or None))
    outcome = {k: record.get(k) for k in ("reward", "n_passed", "n_total", "solved", "tests", "stop_reason", "error",
                                          "verifier_error")}
    completion = sum(s.metrics.completion_tokens or 0 for s in steps if s.metrics is not None)
    return m.Trajectory(
        session_id=_id(record.get("task"), record.get("sample")),
        trajectory_id=_id(_group(record), record.get("task"), record.get("sample")),
        agent=m.Agent(name=ATIF_AGENT, version=__version__, model_name=model_name),
        steps=steps,
        final_metrics=m.FinalMetrics(total_completion_tokens=completion, total_steps=len(steps), extra=outcome),
        extra={"task": record["task"], "family": record.get("family"), "stage": record["stage"],
               "name": record["name"], "iteration": record.get("iteration"), "sample": record["sample"], **outcome},
    )


def atif_to_messages(trajectory: dict | str | Path | Any) -> list[dict[str, Any]]:
    """Chat messages (conch's format: system / user / assistant with `tool_calls` / tool) of an ATIF trajectory,
    given as a harbor model, a dict, JSON text or a .json file. Validated with harbor's models first. Steps marked
    `is_copied_context` are skipped (ATIF: not to be trained on again)."""
    m = _harbor()
    if isinstance(trajectory, Path) or (isinstance(trajectory, str) and not trajectory.lstrip().startswith("{")):
        trajectory = Path(trajectory).read_text()
    if isinstance(trajectory, str):
        trajectory = json.loads(trajectory)
    traj = trajectory if isinstance(trajectory, m.Trajectory) else m.Trajectory.model_validate(trajectory)
    out: list[dict[str, Any]] = []
    for step in traj.steps:
        if step.is_copied_context:
            continue
        text = step.message if isinstance(step.message, str) else "".join(
            getattr(p, "text", None) or "" for p in step.message)
        if step.source != "agent":
            role = (step.extra or {}).get("role", step.source)
            out.append({"role": role, "content": text})
            continue
        msg: dict[str, Any] = {"role": "assistant", "content": text}
        if step.tool_calls:
            msg["tool_calls"] = [{"type": "function", "function": {"name": c.function_name, "arguments": c.arguments}}
                                 for c in step.tool_calls]
        out.append(msg)
        for r in (step.observation.results if step.observation else []):
            content = r.content if isinstance(r.content, str) or r.content is None else "".join(
                getattr(p, "text", None) or "" for p in r.content)
            out.append({"role": "tool", "content": content or ""})
    return out


def export(records: Iterable[dict], out_dir: Path, model_name: str | None = None) -> list[Path]:
    """One `<stage>-<name>/<task>-<sample>.json` ATIF file per record under `out_dir`; returns the paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for r in records:
        traj = to_atif(r, model_name)
        path = out_dir / _group(r) / f"{_id(r.get('task'), r.get('sample'))}.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(traj.to_json_dict(), indent=2, ensure_ascii=False))
        paths.append(path)
    return paths
