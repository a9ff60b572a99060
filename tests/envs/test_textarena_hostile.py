"""TextArena games that misbehave, registered in the real package: a game the bots play forever, a game that
raises, a game that ends without rewards. Each is an error naming the game, never a hang or a bare KeyError."""

from __future__ import annotations

from typing import Any

import pytest

ta = pytest.importorskip("textarena")

from textarena.envs.registration import ENV_REGISTRY, register  # noqa: E402

from ludic.envs import textarena_env  # noqa: E402
from ludic.envs.textarena_env import TextArenaEnv  # noqa: E402

GAVE_UP = 50_000  # the test game stops itself here (5 x MAX_BOT_MOVES), so the old code failed, not hung


class Misbehaving(ta.Env):
    """Two seats. ``mode``: "forever" (the bot's seat keeps the move, the game never ends), "raises" (a move
    crashes the game), "no_rewards" (the game ends on the first move without rewards)."""

    def __init__(self, mode: str) -> None:
        self.mode = mode

    def reset(self, num_players: int, seed: int | None = None) -> None:
        self.state = ta.TwoPlayerState(num_players=num_players, seed=seed)
        self.state.reset(game_state={}, player_prompt_function=lambda player_id, game_state: f"seat {player_id}")
        self.state.current_player_id = 1 if self.mode == "forever" else 0
        self.moves = 0

    def step(self, action: str) -> tuple[bool, dict[str, Any]]:
        self.moves += 1
        if self.moves > GAVE_UP:
            raise AssertionError("test game gave up: nothing stopped the bots")
        if action != "[4]":
            return False, {}  # other moves (the build's probe plays "[0]") pass: the failure comes in play
        if self.mode == "raises":
            raise KeyError("cell")
        if self.mode == "no_rewards":
            self.state.done = True
            return True, {}
        return False, {}


def _game(mode: str) -> str:
    game = f"LudicMisbehaving{mode.title().replace('_', '')}-v0"
    if game not in ENV_REGISTRY:
        register(id=game, entry_point=Misbehaving, mode=mode)
    return game


def test_a_game_the_bots_play_forever_is_an_error_naming_it() -> None:
    env = TextArenaEnv(_game("forever"), players=[0], opponent=lambda obs: "[0]")
    with pytest.raises(RuntimeError, match=r"kept bot seat 1 to move for 200 moves in a row"):  # was: a hang
        env.reset(seed=0)
    assert textarena_env.MAX_SAME_SEAT < textarena_env.MAX_BOT_MOVES * 5 == GAVE_UP


def test_a_game_that_raises_names_the_game_the_seat_and_the_move() -> None:
    env = TextArenaEnv(_game("raises"), players=[0], opponent=lambda obs: "[0]")
    env.reset(seed=0)
    with pytest.raises(RuntimeError, match=r"raised on player_0's move '\[4\]': KeyError: 'cell'"):
        env.step({"player_0": "[4]"})


def test_a_game_that_ends_without_rewards_is_named() -> None:
    env = TextArenaEnv(_game("no_rewards"), players=[0], opponent=lambda obs: "[0]")
    env.reset(seed=0)
    with pytest.raises(RuntimeError, match=r"ended without a reward for seats \[0\]"):  # was: TypeError
        env.step({"player_0": "[4]"})
