"""TextArena games as Ludic multi-agent envs: the policy plays one or more seats, bots play the rest.

Needs the ``textarena`` extra (``pip install 'ludic[textarena]'``); it is imported only when an env is
built. Any game id works (``textarena.make``); the game is made without TextArena's default wrappers
(``-raw``), because the default one resends the whole history every turn. The observation is built
here from the game's own messages, per seat:

- ``"board"``: the seat's first prompt and the latest game board (the last message when the game
  shows no board): bounded, the right view for board games;
- ``"board_only"``: the latest game board alone (the last message when none), without the first
  prompt's rules and seat: the shortest view, for a policy that always plays the same seat of a game
  whose board lists the legal moves (TicTacToe: about 190 characters instead of 500);
- ``"first_last"`` (default): the first prompt and the latest message: bounded, any game;
- ``"full"``: every message so far, joined: grows with the game; only when asked.

Seats the policy plays are agents ``player_<i>`` (several seats: self-play through
``MultiAgentProtocol``, one agent per seat); the other seats are played inside the env by an
``opponent``: ``"random"`` (a uniform choice among the ``[...]`` moves the game lists after
"Available Moves", "Valid moves" or "available actions are"), a callable ``obs -> action``, or a
``"module:attr"`` naming one. Rewards are the game's own at the end (``close()``), per seat; step info
carries the game's info for that seat.

``num_players`` defaults to the game's own seat count (single-player games: 1, no opponent). A game that
cannot run here (see :mod:`ludic.envs.textarena_games`), or one whose board lists no moves while the
``"random"`` opponent is to play a seat, is refused when the env is built, with the reason.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any, Literal

from ludic.envs.demonstrations import Demonstration
from ludic.envs.env import LudicEnv
from ludic.envs.textarena_games import (
    PROBE_MOVES,
    Bot,
    RandomMoveBot,
    bot,
    check_resets,
    listed_moves,
    make_raw,
    probe_moves,
    seat_count,
)
from ludic.types import Info, StepOutcome

EXTRA = "textarena"
View = Literal["board", "board_only", "first_last", "full"]
MAX_BOT_MOVES = 10_000
"""Bot moves in a row (no policy seat to move, the game not over) after which the game is taken as
one that never ends: an error naming it, instead of a loop that never returns."""
MAX_SAME_SEAT = 200
"""Bot moves in a row by one seat after which its moves are taken as refused forever (a game that keeps
asking for a valid move without applying its error allowance, e.g. SantoriniBaseFixed-v0's random bot)."""


def _textarena() -> Any:
    try:
        import textarena
    except ImportError as exc:
        raise ImportError(
            f"the textarena env needs the {EXTRA!r} extra: pip install 'ludic[{EXTRA}]'"
        ) from exc
    return textarena


def render(messages: Sequence[tuple[int, str, Any]], view: View) -> str:
    """One seat's observation from the game's messages to it (see the module docstring)."""
    if not messages:
        return ""
    texts = [m[1] for m in messages]
    if view == "full":
        return "\n\n".join(texts)
    kinds = [getattr(m[2], "name", "") for m in messages]
    first = next((t for t, k in zip(texts, kinds) if k == "PROMPT"), texts[0])
    boards = [t for t, k in zip(texts, kinds) if k == "GAME_BOARD"]
    latest = boards[-1] if view in ("board", "board_only") and boards else texts[-1]
    if view == "board_only":
        return latest
    return first if latest is first else f"{first}\n\n{latest}"


class TextArenaEnv(LudicEnv[str, str, str]):
    """A TextArena game; ``reset(seed=s)`` resets the game with seed ``s``.

    game: a TextArena id ("TicTacToe-v0"); num_players: seats in the game (default: the game's own).
    players: the seats the policy plays (default ``[0]``; ``[0, 1]`` is self-play).
    opponent: who plays the other seats (see the module docstring); observation: "board",
    "board_only", "first_last" or "full"; game_kwargs: the game's own constructor arguments.
    invalid_move_reward: None (default) keeps the game's rewards; a number is the reward of a policy move
    the game refused but let the seat retry (TextArena's error allowance; its info holds
    ``invalid_move``), so per-turn credit lands on that move (the game's own end rewards are unchanged).
    ``demonstrations(n, seed)`` (``[sft] from_env = true``): random listed moves, see there.
    """

    def __init__(
        self,
        game: str,
        *,
        num_players: int | None = None,
        players: Sequence[int] = (0,),
        opponent: str | Bot = "random",
        observation: View = "first_last",
        game_kwargs: dict[str, Any] | None = None,
        invalid_move_reward: float | None = None,
    ) -> None:
        if observation not in ("board", "board_only", "first_last", "full"):
            raise ValueError(
                "textarena env: observation must be 'board', 'board_only', 'first_last' or 'full', "
                f"got {observation!r}"
            )
        self.game, self.game_kwargs = game, dict(game_kwargs or {})
        _textarena()
        if num_players is None:
            num_players = seat_count(game, self.game_kwargs)
        bad = [p for p in players if not 0 <= p < num_players]
        if not players or bad or len(set(players)) != len(players):
            raise ValueError(
                f"textarena env: players {list(players)} must be distinct seats in 0..{num_players - 1}"
            )
        self.num_players, self.view = num_players, observation
        self.players, self.opponent = list(players), opponent
        self.invalid_move_reward = invalid_move_reward
        probe = check_resets(game, self.game_kwargs, num_players)  # fails here, not at the first episode
        if opponent == "random" and len(self.players) < num_players:
            self._check_listed(probe)
        probe_moves(probe, game)  # a game that crashes on its first moves is refused now, with its reason
        if opponent == "random" and len(self.players) < num_players:
            self._trial()
        self._seen: dict[int, list] = {}
        self._done = True

    def _make(self) -> Any:
        return make_raw(self.game, self.game_kwargs)

    def _check_listed(self, probe: Any) -> None:
        """The 'random' opponent needs the moves listed; a game that lists none is refused now."""
        pid, messages = probe.get_observation()
        if listed_moves(render(messages, self.view)):
            return
        seats = list(range(self.num_players))
        raise ValueError(
            f"textarena env: {self.game} lists no moves (no \"Available Moves:\" or \"Valid moves:\" line "
            f"in seat {pid}'s {self.view!r} observation), so the 'random' opponent cannot play seats "
            f"{[p for p in seats if p not in self.players]}; play every seat (players = {seats}, self-play "
            "with the multi_agent protocol) or set opponent = 'module:attr' (a function obs -> move)"
        )

    @property
    def agent_ids(self) -> list[str]:
        return [f"player_{p}" for p in self.players]

    @property
    def active_agents(self) -> list[str]:
        if self._done:
            return []
        return [f"player_{self._env.state.current_player_id}"]

    def reset(self, seed: int | None = None) -> dict[str, tuple[str, Info]]:
        self._env = self._make()
        self._env.reset(num_players=self.num_players, seed=seed)
        self._bot = bot(self.opponent, seed)
        self._seen = {p: [] for p in range(self.num_players)}
        self._done = False
        self._advance_bots()
        return {f"player_{p}": (self._view(p), {"seat": p, "game": self.game}) for p in self.players}

    def step(self, actions: dict[str, str]) -> dict[str, StepOutcome]:
        if self._done:
            raise RuntimeError("TextArenaEnv: the game is over; call reset()")
        mover = f"player_{self._env.state.current_player_id}"
        if set(actions) != {mover}:
            raise KeyError(f"TextArenaEnv: expected exactly the action of {mover!r}, got {sorted(actions)}")
        self._take_turn()
        errors = getattr(self._env.state, "error_count", 0)
        self._done = self._play(mover, actions[mover])
        refused = not self._done and getattr(self._env.state, "error_count", 0) > errors  # a retry is granted
        if not self._done:
            self._advance_bots()
        if self._done:
            return self._final()
        shaped = self.invalid_move_reward if refused and self.invalid_move_reward is not None else 0.0
        return {
            aid: StepOutcome(
                obs=self._view(p),
                reward=shaped if aid == mover else 0.0,
                truncated=False,
                terminated=False,
                info={"invalid_move": True} if refused and aid == mover else {},
            )
            for p, aid in zip(self.players, self.agent_ids)
        }

    def demonstrations(self, n: int, seed: int) -> list[Demonstration]:
        """``n`` turns of the policy's seats, each its observation -> a uniformly random move among the
        "Available Moves" listed in it: the game's own move format and legal moves, no strategy (a warm
        start that leaves the play to RL). Games are seeded from ``seed``; the env is left reset."""
        rng = random.Random(seed)
        pick, demos = RandomMoveBot(rng.randrange(2**31)), []
        while len(demos) < n:
            self.reset(seed=rng.randrange(2**31))
            while not self._done and len(demos) < n:
                seat = self._env.state.current_player_id
                obs = self._view(seat)
                if not listed_moves(obs):
                    raise ValueError(
                        f"textarena env: {self.game} lists no moves in seat {seat}'s {self.view!r} observation, "
                        "so it has no demonstrations (they are random listed moves); use an [sft] data file "
                        "instead of from_env, or another observation if the moves are listed outside it"
                    )
                move = pick(obs)
                demos.append(Demonstration(obs, move))
                self.step({f"player_{seat}": move})
        self.reset(seed=seed)
        return demos

    def _trial(self) -> None:
        """A short game against the 'random' opponent (the policy plays its first listed moves): a game its
        bots cannot play is refused now, not at the first episode."""
        try:
            self.reset(seed=0)
            for _ in range(PROBE_MOVES):
                if self._done:
                    break
                seat = self._env.state.current_player_id
                self.step({f"player_{seat}": (listed_moves(self._view(seat)) or ["[0]"])[0]})
        except (RuntimeError, ValueError) as exc:  # the game or the bot (a move list that stops coming)
            raise ValueError(f"textarena env: {self.game} cannot be played by the 'random' opponent: {exc}") from exc
        finally:
            self._done = True

    def _take_turn(self) -> int:
        """Move the current seat's pending messages into what it has seen; returns the seat."""
        pid, messages = self._env.get_observation()
        self._seen[pid].extend(messages)
        return pid

    def _advance_bots(self) -> None:
        """Bots play until a policy seat is to move or the game ends (at most ``MAX_BOT_MOVES``)."""
        last, same = None, 0
        for _ in range(MAX_BOT_MOVES):
            if self._done or self._env.state.current_player_id in self.players:
                return
            pid = self._take_turn()
            last, same = pid, same + 1 if pid == last else 1
            if same > MAX_SAME_SEAT:
                raise RuntimeError(
                    f"textarena env: {self.game} kept bot seat {pid} to move for {MAX_SAME_SEAT} moves in a row (its "
                    "moves refused, the game not ending); play every seat or set opponent = 'module:attr'"
                )
            self._done = self._play(f"bot seat {pid}", self._bot(render(self._seen[pid], self.view)))
        if not self._done and self._env.state.current_player_id not in self.players:
            raise RuntimeError(
                f"textarena env: {self.game} did not end after {MAX_BOT_MOVES} bot moves in a row and never "
                f"gave a policy seat {self.players} the move"
            )

    def _play(self, who: str, move: str) -> bool:
        """The game's step on ``move``; a game that raises is an error naming the game, the mover and the move."""
        try:
            done, _ = self._env.step(move)
        except Exception as exc:
            raise RuntimeError(
                f"textarena env: {self.game} raised on {who}'s move {move!r:.80}: {type(exc).__name__}: {exc}"
            ) from exc
        return bool(done)

    def _view(self, seat: int) -> str:
        pending = list(self._env.state.observations.get(seat, []))
        return render(self._seen[seat] + pending, self.view)

    def _final(self) -> dict[str, StepOutcome]:
        rewards, game_info = self._env.close()
        missing = [p for p in self.players if not isinstance(rewards, dict) or p not in rewards]
        if missing:
            raise RuntimeError(f"textarena env: {self.game} ended without a reward for seats {missing}: {rewards!r:.80}")
        if any(not isinstance(r, (int, float)) for r in rewards.values()):
            raise RuntimeError(f"textarena env: {self.game} ended with non-numeric rewards: {rewards!r:.120}")
        out = {}
        for p, aid in zip(self.players, self.agent_ids):
            reward = float(rewards[p])
            others = [float(r) for q, r in rewards.items() if q != p]
            result = _result(reward, others)
            info = {**dict(game_info.get(p, {})), "result": result, "game_rewards": dict(rewards)}
            out[aid] = StepOutcome(obs=None, reward=reward, truncated=False, terminated=True, info=info)
        return out


def _result(reward: float, others: list[float]) -> str:
    """win / loss / draw against the other seats' rewards; alone (a single-player game), a win is reward
    1, which TextArena's single-player games give only for solving (FrozenLake's partial progress is < 1)."""
    if not others:
        return "win" if reward >= 1.0 else "loss"
    if reward == max(others):
        return "draw"
    return "win" if reward > max(others) else "loss"
