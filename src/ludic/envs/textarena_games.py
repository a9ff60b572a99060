"""What a TextArena game needs before it can be played: its raw (unwrapped) version, its seat count,
and the moves it lists. Many registered games cannot run everywhere (written for a newer Python, needing
NLTK data or an OpenRouter key, shipped without their data files); each is refused here with the game's
own reason, so ``ludic train --dry-run`` says why instead of the first episode crashing."""

from __future__ import annotations

import importlib
import random
import re
from collections.abc import Callable
from typing import Any

Bot = Callable[[str], str]

SEAT_COUNTS = (2, 1, 3, 4, 5, 6, 7, 8)
"""Seat counts tried in order when a config gives none: two first (most games; several multi-seat games
also accept one seat without saying so), then one (single-player games take only 1), then more."""
_LISTED = re.compile(r"(?:Available|Valid|Legal) (?:Moves|Actions)(?: are)?:([^\n]*)", re.IGNORECASE)
_MOVE = re.compile(r"\[[^\[\]]+\]")


class GameUnavailable(ValueError):
    """A TextArena game that cannot be made or reset here; the message holds the game's reason."""


def listed_moves(obs: str) -> list[str]:
    """The ``[...]`` moves on the last "Available Moves:" / "Valid moves:" / "available actions are:" line
    (TicTacToe's ``[4]``, FrozenLake's ``[up]``, Othello's ``[2, 3]``, KuhnPoker's ``[check]``); [] if none."""
    listed = _LISTED.findall(obs)
    return _MOVE.findall(listed[-1]) if listed else []


def reason(exc: BaseException) -> str:
    """One line from a game's exception (NLTK's boxed LookupError becomes its "Resource ... not found")."""
    text = " ".join(line.strip(" *") for line in str(exc).splitlines() if line.strip(" *"))
    if isinstance(exc, LookupError) and "Resource" in text:
        text = text[text.index("Resource") :].split(".", 1)[0] + " (NLTK data, not installed here)"
    return f"{type(exc).__name__}: {text[:200]}"


def make_raw(game: str, game_kwargs: dict[str, Any]) -> Any:
    """The game without TextArena's wrappers: ``<id>-raw`` when registered (``-train`` and ``-raw`` ids
    map to it), else the id itself. Unknown ids and games that fail to import or build are errors
    naming the game."""
    import textarena as ta
    from textarena.envs.registration import ENV_REGISTRY

    base = game.removesuffix("-raw").removesuffix("-train")
    target = f"{base}-raw" if f"{base}-raw" in ENV_REGISTRY else game
    if target not in ENV_REGISTRY:
        raise ValueError(f"textarena env: {game!r} is not a TextArena game id (textarena.make knows it not)")
    try:
        return ta.make(target, **game_kwargs)
    except Exception as exc:  # SyntaxError on import, missing API keys, missing modules
        raise GameUnavailable(f"textarena env: TextArena game {game!r} cannot be made here: {reason(exc)}") from exc


def seat_count(game: str, game_kwargs: dict[str, Any]) -> int:
    """The first of :data:`SEAT_COUNTS` the game resets with; an error with the game's reason if none."""
    failures: list[BaseException] = []
    for n in SEAT_COUNTS:
        try:
            make_raw(game, game_kwargs).reset(num_players=n, seed=0)
            return n
        except GameUnavailable:
            raise
        except Exception as exc:  # the game's own seat check (AssertionError) or a missing resource
            failures.append(exc)
    other = [e for e in failures if not isinstance(e, AssertionError)]
    why = reason((other or failures)[0])
    raise GameUnavailable(
        f"textarena env: TextArena game {game!r} cannot be reset here with any of {list(SEAT_COUNTS)} "
        f"seats: {why}"
    )


def check_resets(game: str, game_kwargs: dict[str, Any], num_players: int) -> Any:
    """A game reset once with ``num_players`` (seed 0), or an error with the game's reason."""
    env = make_raw(game, game_kwargs)
    try:
        env.reset(num_players=num_players, seed=0)
    except Exception as exc:
        raise GameUnavailable(
            f"textarena env: TextArena game {game!r} cannot be reset with num_players = {num_players}: "
            f"{reason(exc)}"
        ) from exc
    return env


PROBE_MOVES = 6


def probe_moves(env: Any, game: str, moves: int = PROBE_MOVES) -> None:
    """Plays a reset game ``moves`` moves (each seat: a listed move, else the first ``[...]`` in its view,
    else ``[0]``) and checks the end's rewards are numbers per seat: TextArena games that crash on a move
    or end with a text as reward (CharacterConclave, Cryptarithm in 0.7.4) are refused with that reason."""
    for _ in range(moves):
        _pid, messages = env.get_observation()
        view = "\n".join(str(m[1]) for m in messages)
        move = (listed_moves(view) or _MOVE.findall(view) or ["[0]"])[0]
        try:
            done, _ = env.step(move)
            if not done:
                continue
            rewards, _info = env.close()
            bad = {p: r for p, r in dict(rewards or {}).items() if not isinstance(r, (int, float))}
        except Exception as exc:
            raise GameUnavailable(
                f"textarena env: TextArena game {game!r} raised on a probe move {move!r:.40}: {reason(exc)}"
            ) from exc
        if bad or not rewards:
            raise GameUnavailable(
                f"textarena env: TextArena game {game!r} ended a probe game without numeric rewards per seat "
                f"(got {rewards!r:.120})"
            )
        return


class RandomMoveBot:
    """Plays a uniformly random move among those the game lists (:func:`listed_moves`: TicTacToe's
    ``'[4]'``, FrozenLake's ``[up]``, Othello's ``[2, 3]``)."""

    def __init__(self, seed: int | None = None) -> None:
        self.rng = random.Random(seed)

    def __call__(self, obs: str) -> str:
        moves = listed_moves(obs)
        if not moves:
            raise ValueError(
                'textarena env: the \'random\' opponent found no "Available Moves: [..]" (or "Valid moves:", '
                '"Available Actions:") list in the observation; play every seat, or pass opponent as a callable '
                "obs -> action for this game"
            )
        return self.rng.choice(moves)


def bot(opponent: str | Bot, seed: int | None) -> Bot:
    if callable(opponent):
        return opponent
    if opponent == "random":
        return RandomMoveBot(seed)
    if isinstance(opponent, str) and ":" in opponent:
        module, attr = opponent.split(":", 1)
        return getattr(importlib.import_module(module), attr)
    raise ValueError(
        f"textarena env: opponent must be 'random', 'module:attr' or a callable, got {opponent!r}"
    )
