"""Built-in harnesses and the single-agent protocol, wired by name, on the quickstart env."""

from __future__ import annotations

from ludic.envs.letter_repeat import LetterRepeatEnv, letter_for_seed
from ludic.registry import HARNESS_REGISTRY, PROTOCOL_REGISTRY
from ludic.registry.builtins import plain_parser
from ludic.testing.scripted_client import ScriptedChatClient


def test_plain_parser_strips_and_never_fails() -> None:
    result = plain_parser("  dddd\n")
    assert (result.action, result.reward, result.obs) == ("dddd", 0.0, None)


async def _play(reply, **harness_kw):
    client = ScriptedChatClient([reply])
    agent = HARNESS_REGISTRY.build("plain", client=client, model="m", **harness_kw)
    protocol = PROTOCOL_REGISTRY.build("single_agent", agent=agent)
    (rollout,) = await protocol.run(env=LetterRepeatEnv(count=2, letters="ab"), max_steps=1, env_seed=4)
    return rollout


async def test_plain_harness_scores_the_reply_through_the_env() -> None:
    letter = letter_for_seed(4, "ab")
    rollout = await _play(letter * 2)
    step = rollout.steps[0]
    assert step.prev_obs == f"Repeat {letter} 2 times."
    assert step.reward == 1.0
    assert step.info["parsed_action"] == letter * 2
    assert step.info["correct"] is True


async def test_reply_cut_at_max_tokens_gets_the_incomplete_reward() -> None:
    rollout = await _play(("aaaaaaa", "length"), incomplete_reward=0.0)
    assert rollout.steps[0].info["parse_error"] is True
    assert rollout.steps[0].reward == 0.0
    default = await _play(("aaaaaaa", "length"))  # default: the env scores the cut reply as it is
    assert default.steps[0].info["parse_error"] is False
    assert default.steps[0].info["finish_reason"] == "length"
    assert 0.0 <= default.steps[0].reward <= 1.0  # the task's own scale, not a -1 penalty


async def test_xml_move_harness_extracts_the_tag() -> None:
    client = ScriptedChatClient(["thinking... <move>5</move>"])
    agent = HARNESS_REGISTRY.build("xml_move", client=client, model="m")
    from ludic.envs import TicTacToeEnv

    protocol = PROTOCOL_REGISTRY.build("single_agent", agent=agent)
    (rollout,) = await protocol.run(env=TicTacToeEnv(), max_steps=1, env_seed=0)
    assert rollout.steps[0].info["parsed_action"] == "5"
    assert rollout.steps[0].info["illegal_move"] is False
