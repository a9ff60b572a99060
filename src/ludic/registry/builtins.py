"""Built-in harnesses (agent + context + parser) and protocols, registered by name in ``ludic.registry``."""

from __future__ import annotations

from typing import Any

from ludic.inference.sampling import SamplingConfig
from ludic.parsers import ParseResult


def plain_parser(text: str) -> ParseResult:
    """The whole reply (stripped) is the action; no format reward."""
    return ParseResult(action=text.strip(), reward=0.0, obs=None)


def _agent(
    client: Any,
    model: str,
    parser: Any,
    tokenizer: Any,
    sampling: Any,
    system_prompt: str | None,
    recent: int | None = None,
    **agent_kw: Any,
) -> Any:
    from ludic.agents import Agent
    from ludic.context import FullDialog, RecentMessages

    agent_kw = {k: v for k, v in agent_kw.items() if v is not None}  # None: keep the Agent's default
    ctx = FullDialog(system_prompt) if recent is None else RecentMessages(recent, system_prompt)
    return Agent(
        client=client,
        model=model,
        ctx=ctx,
        parser=parser,
        tokenizer=tokenizer,
        sampling=sampling,
        **agent_kw,
    )


def plain_harness(
    *,
    client: Any,
    model: str,
    tokenizer: Any = None,
    sampling: SamplingConfig | None = None,
    system_prompt: str | None = None,
    incomplete_reward: float | None = None,
    recent: int | None = None,
) -> Any:
    """Agent with full-dialog memory whose action is its whole reply.

    incomplete_reward: None (default) parses a reply cut at max_tokens as it is; a number makes
        it a parse failure with that reward (see ``Agent``).
    recent: None (default) sends the whole dialog; N sends only the last N messages
        (``RecentMessages``: for envs whose observation holds the whole state, a board game's board).
    """
    return _agent(
        client,
        model,
        plain_parser,
        tokenizer,
        sampling,
        system_prompt,
        recent,
        incomplete_reward=incomplete_reward,
    )


def xml_move_harness(
    *,
    client: Any,
    model: str,
    tokenizer: Any = None,
    sampling: SamplingConfig | None = None,
    system_prompt: str | None = None,
    tag: str = "move",
    success_reward: float = 0.0,
    error_reward: float = -1.0,
    incomplete_reward: float | None = None,
    recent: int | None = None,
) -> Any:
    """Agent whose action is the content of ``<tag>...</tag>``; a missing tag is a parse error.
    recent: as for ``plain``."""
    from ludic.parsers import xml_tag_parser

    parser = xml_tag_parser(tag, success_reward=success_reward, error_reward=error_reward)
    return _agent(
        client, model, parser, tokenizer, sampling, system_prompt, recent, incomplete_reward=incomplete_reward
    )


def single_agent_protocol(*, agent: Any, **kwargs: Any) -> Any:
    """The synchronous single-agent loop (``SingleAgentProtocol``)."""
    from ludic.interaction import SingleAgentProtocol

    return SingleAgentProtocol(agent=agent, **kwargs)


def multi_agent_protocol(*, new_agent: Any, agents: list[str], use_env_sysprompt: bool = True) -> Any:
    """``MultiAgentProtocol`` with a fresh agent of the run's harness (the same policy) in each seat of
    ``agents`` (env agent ids, e.g. ``["player_0", "player_1"]``: self-play); the env plays the others."""
    from ludic.interaction import MultiAgentProtocol

    if isinstance(agents, str) or not agents or not all(isinstance(a, str) for a in agents):
        raise ValueError(
            f"multi_agent protocol: agents must be a non-empty list of env agent ids, got {agents!r}"
        )
    if len(set(agents)) != len(agents):
        raise ValueError(f"multi_agent protocol: agents {agents!r} repeat an id")
    return MultiAgentProtocol({aid: new_agent() for aid in agents}, use_env_sysprompt=use_env_sysprompt)
