"""The demonstrations of a run config's ``[sft]`` table, read, checked and turned into SFT items.

From a JSONL file (``demonstrations = "demos.jsonl"``: per line ``{"prompt": str | messages, "answer": str}``
or ``{"messages": [..., {"role": "assistant", "content": str}]}``, either with an optional ``"tools"`` list
rendered into the prompt as the agent's ``tools=`` are), or from the training env
(``from_env = true``: env kinds implementing ``ludic.envs.demonstrations.ProvidesDemonstrations``).
A string prompt gets the system prompt the agent will have (the harness's ``system_prompt``, else the
env's ``suggested_sysprompt``), so the SFT item's prompt ids are the ids the agent sends; a message-list
prompt is used as written.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ludic.config import RunConfig
from ludic.envs.demonstrations import Demonstration, ProvidesDemonstrations
from ludic.registry import ENV_REGISTRY
from ludic.training.types import SAWItem


def read_demonstrations(path: str | Path) -> list[Demonstration]:
    """Every demonstration in a JSONL file; a bad line is a ValueError naming the file and line."""
    return [d for _, d in located_demonstrations(path)]


def located_demonstrations(path: str | Path) -> list[tuple[str, Demonstration]]:
    """``("file:line", demonstration)`` per line, so a later check (its prompt's length) can name the row."""
    from ludic.training.batching.jsonl import iter_jsonl_numbered

    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"no such demonstrations file {str(path)!r}")
    demos = []
    for lineno, record in iter_jsonl_numbered(p):
        try:
            demos.append((f"{path}:{lineno}", _demonstration(record)))
        except ValueError as exc:
            raise ValueError(f"{path}:{lineno}: {exc}") from exc
    if not demos:
        raise ValueError(f"{path}: holds no demonstrations")
    return demos


def _demonstration(record: dict[str, Any]) -> Demonstration:
    if "messages" in record:
        if "prompt" in record or "answer" in record:
            raise ValueError("give either messages or prompt + answer, not both")
        messages = record["messages"]
        if not isinstance(messages, list) or len(messages) < 2:
            raise ValueError("messages must be a list of at least 2 messages (the prompt, then the answer)")
        last = messages[-1]
        if not isinstance(last, dict) or last.get("role") != "assistant":
            raise ValueError("the last message must be the assistant's answer ({'role': 'assistant', ...})")
        if last.get("tool_calls"):
            raise ValueError("the answer's tool_calls: write the call as the answer's content, in the model's own "
                             'format (e.g. <tool_call>{"name": ..., "arguments": {...}}</tool_call>), as it samples it')  # fmt: skip
        return Demonstration(messages[:-1], last.get("content"), record.get("tools"))  # type: ignore[arg-type]
    missing = [k for k in ("prompt", "answer") if k not in record]
    if missing:
        raise ValueError(f"no {' or '.join(missing)} field (nor messages); fields: {sorted(record)}")
    return Demonstration(record["prompt"], record["answer"], record.get("tools"))


def training_env(cfg: RunConfig) -> Any:
    """The training env of ``[env]`` (reset at the first training seed)."""
    env = ENV_REGISTRY.get(cfg.env.name)(**cfg.env.kwargs)
    env.reset(seed=cfg.rollout.seed)
    return env


def env_demonstrations(cfg: RunConfig, env: Any, n: int) -> list[Demonstration]:
    """``n`` demonstrations from the training env, chosen by ``[sft].seed`` (default: the run's seed)."""
    if not isinstance(env, ProvidesDemonstrations):
        raise ValueError(
            f"env {cfg.env.name!r} ({type(env).__name__}) provides no demonstrations (no demonstrations(n, "
            "seed) method); give [sft].demonstrations = 'file.jsonl' instead"
        )
    sft = cfg.sft
    assert sft is not None
    demos = env.demonstrations(n, cfg.seed if sft.seed is None else sft.seed)
    if not demos or not all(isinstance(d, Demonstration) for d in demos):
        raise ValueError(
            f"env {cfg.env.name!r}: demonstrations() must return a non-empty list of Demonstration"
        )
    return list(demos)


def config_demonstrations(cfg: RunConfig, env: Any) -> list[tuple[str, Demonstration]]:
    """What ``[sft]`` names, each with where it came from: the file's demonstrations ("file:line"), or
    steps x batch_size from the env ("env 'name' demonstration i")."""
    sft = cfg.sft
    if sft is None:
        raise ValueError("the config has no [sft] table")
    if sft.demonstrations is not None:
        demos = located_demonstrations(sft.demonstrations)
        if sft.batch_size > len(demos):  # the cycled file would put a row in one batch more than once
            raise ValueError(
                f"[sft].batch_size = {sft.batch_size} is more than the {len(demos)} demonstrations in "
                f"{sft.demonstrations}: every step would train some of them twice; lower batch_size"
            )
        return demos
    demos = env_demonstrations(cfg, env, sft.steps * sft.batch_size)
    return [(f"env {cfg.env.name!r} demonstration {i}", d) for i, d in enumerate(demos)]


def agent_system_prompt(cfg: RunConfig, env: Any) -> str | None:
    """The system prompt the agent starts with: the harness's own, else the env's suggestion (as the
    single-agent protocol gives it unless ``use_env_sysprompt = false``)."""
    if cfg.harness.kwargs.get("system_prompt") is not None:
        return str(cfg.harness.kwargs["system_prompt"])
    if cfg.protocol.kwargs.get("use_env_sysprompt", True) is False:
        return None
    return getattr(env, "suggested_sysprompt", None)


def demonstration_items(cfg: RunConfig, tokenizer: Any) -> list[SAWItem]:
    """``[sft]``'s demonstrations as SFT items, prompts tokenised as the agent will send them."""
    env = training_env(cfg)
    system_prompt = agent_system_prompt(cfg, env)
    return [
        _item(cfg, tokenizer, where, d, i, system_prompt)
        for i, (where, d) in enumerate(config_demonstrations(cfg, env))
    ]


def _item(cfg: RunConfig, tokenizer: Any, where: str, d: Demonstration, i: int, system: str | None) -> SAWItem:
    """One SFT item; a prompt that fills ``max_seq_len`` is refused: truncation would leave it no answer
    token, a prompt-only item that trains nothing yet counts in its batch."""
    from ludic.training.batching.sft_data import sft_item

    item = sft_item(
        tokenizer, d.prompt, d.answer, system_prompt=system if isinstance(d.prompt, str) else None,
        tools=d.tools, meta={"rollout_id": f"sft-{i}", "step_index": 0},
    )  # fmt: skip
    limit, n = cfg.trainer.max_seq_len, item.meta["prompt_length"]
    if n >= limit:
        raise ValueError(
            f"{where}: prompt is {n} tokens (system prompt and tools included), not shorter than "
            f"[trainer].max_seq_len = {limit}: truncation would leave no answer token; shorten it or raise max_seq_len"
        )
    return item


def sft_errors(cfg: RunConfig) -> list[str]:
    """Problems with ``[sft]`` found without a model (the file's every line, the env's method)."""
    if cfg.sft is None:
        return []
    key = "[sft].demonstrations" if cfg.sft.demonstrations is not None else "[sft].from_env"
    try:
        config_demonstrations(cfg, None if cfg.sft.demonstrations is not None else training_env(cfg))
    except Exception as exc:
        return [f"{key}: {type(exc).__name__}: {exc}"]
    return []
