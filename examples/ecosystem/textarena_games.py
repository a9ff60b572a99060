"""TextArena games learn on the tiny CPU model: SFT on random listed moves, then GRPO with per-turn credit.

    pip install -e ".[textarena]"
    .venv/bin/python examples/ecosystem/textarena_games.py                       # FrozenLake-v0, seed 0
    .venv/bin/python examples/ecosystem/textarena_games.py --game TicTacToe-v0   # against the random bot

Each game runs unchanged through the ``textarena`` env kind (``TextArenaEnv``; moves written the game's own
way, ``[down]``, ``[4]``) with the ``board_only`` observation: the game's latest board with its listed moves,
which does not grow. FrozenLake-v0 is single player (a 4x4 lake, 3 holes placed by the game's seed; a win
is reaching the goal); in TicTacToe-v0 the policy plays seat 0 and a bot plays a random listed move in
seat 1. The agent sends only that observation (``RecentMessages(keep=1)``) and its whole reply is the
move. The warm start is the env's own ``demonstrations`` (random moves among those the board lists: the
format, no strategy); RL is GRPO's loss with per-turn credit (``PerTurnReturn``), and a move the game
refuses scores -1 on that move (``invalid_move_reward``; with only the game's end reward, RL reinforced
garbage first tries in won games and collapsed). It prints the win rate on held-out games (fixed seeds,
sampled at temperature 1) with 95% Wilson intervals before training, at the start of RL and after RL,
and writes ``summary.json`` to ``--output-dir``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import time
from pathlib import Path
from typing import Any

from ludic.agents import Agent
from ludic.context import RecentMessages
from ludic.distributed import ClientPublisher
from ludic.envs.textarena_env import TextArenaEnv
from ludic.eval import Evaluator, wilson
from ludic.inference import InferenceSpec, SamplingConfig, TransformersChatClient
from ludic.interaction import SingleAgentProtocol
from ludic.registry.builtins import plain_parser
from ludic.training import (
    EnvSpec,
    PerTurnReturn,
    ProtocolSpec,
    RolloutEngine,
    RolloutRequest,
    SeededRequests,
    Trainer,
    TrainerConfig,
    make_grpo,
    online_trainer,
    sft_items,
    sft_trainer,
)
from ludic.training.loggers import progress_and_metrics


@dataclasses.dataclass(frozen=True)
class Preset:
    """A game as this script plays it: the ``textarena`` env's kwargs, its turn and reply limits, and
    the default schedule (the one docs/ecosystem.md reports)."""

    env: dict[str, Any]
    max_turns: int  # policy calls per game, retries included
    max_new_tokens: int
    sft_steps: int
    steps: int  # GRPO steps
    prompts_per_step: int


GAMES = {
    # single player: 4x4 lake, 3 holes placed by the seed, a win is reaching the goal (the game's reward 1;
    # falling in or walking off the edge twice ends the game with partial credit); the shortest path is 6
    # moves; "[right]" is 7 tokens + end of turn
    "FrozenLake-v0": Preset(
        {"game": "FrozenLake-v0", "num_players": 1, "players": [0], "observation": "board_only",
         "invalid_move_reward": -1.0},  # walking into the edge is refused (one retry), scored where it happens
        max_turns=12, max_new_tokens=8, sft_steps=150, steps=60, prompts_per_step=4,
    ),
    # the policy in seat 0, a bot playing a random listed move in seat 1; 5 moves + retries; "[4]" + end of turn
    "TicTacToe-v0": Preset(
        {"game": "TicTacToe-v0", "players": [0], "opponent": "random", "observation": "board_only",
         "invalid_move_reward": -1.0},  # a refused move is scored where it happens (the game lets it retry once)
        max_turns=7, max_new_tokens=4, sft_steps=50, steps=40, prompts_per_step=2,
    ),
}  # fmt: skip
EVAL_SEEDS = 1_000_000  # held-out games; RL plays seeds below 10**6 (the demonstrations draw their own)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Flags left at None take the game's preset."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--game", choices=sorted(GAMES), default="FrozenLake-v0")
    p.add_argument("--output-dir", default=None, help="default: runs/ecosystem/textarena_<game>")
    p.add_argument(
        "--seed", type=int, default=0, help="fixes the tiny model, the demonstrations and the RL games"
    )
    p.add_argument(
        "--hidden-size", type=int, default=128, help="tiny model width (128: about 0.8M parameters)"
    )
    p.add_argument("--sft-moves", type=int, default=800, help="demonstrated moves (random listed moves)")
    p.add_argument("--sft-steps", type=int, default=None)
    p.add_argument("--sft-lr", type=float, default=1e-3)
    p.add_argument("--steps", type=int, default=None, help="GRPO steps")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument(
        "--prompts-per-step", type=int, default=None, help="games per step (each played group-size times)"
    )
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument(
        "--positive-only", action=argparse.BooleanOptionalAction, default=True,
        help="clamp advantages at 0 (never push a move down)",
    )  # fmt: skip
    p.add_argument("--max-turns", type=int, default=None, help="policy calls per game")
    p.add_argument("--eval-games", type=int, default=256)
    p.add_argument("--max-new-tokens", type=int, default=None)
    args = p.parse_args(argv)
    preset = dataclasses.asdict(GAMES[args.game])
    for name in ("max_turns", "max_new_tokens", "sft_steps", "steps", "prompts_per_step"):
        if getattr(args, name) is None:
            setattr(args, name, preset[name])
    args.output_dir = args.output_dir or f"runs/ecosystem/textarena_{args.game.split('-')[0].lower()}"
    return args


def build_engine(client: Any) -> RolloutEngine:
    """A fresh agent per game: it sends the latest observation only; its whole reply is the move."""

    def protocol() -> SingleAgentProtocol:
        agent = Agent(client=client, model="policy", ctx=RecentMessages(keep=1), parser=plain_parser)
        return SingleAgentProtocol(agent=agent)

    return RolloutEngine(env_registry={"textarena": TextArenaEnv}, protocol_registry={"agent": protocol})


def game(name: str, seed: int, sampling: SamplingConfig) -> RolloutRequest:
    return RolloutRequest(
        EnvSpec("textarena", dict(GAMES[name].env)), ProtocolSpec("agent"), env_seed=seed, sampling_seed=seed,
        inference=InferenceSpec(sampling),
    )  # fmt: skip


def win_rate(rollouts: list[Any]) -> dict[str, Any]:
    """Win / draw rate per game (the game's own result), the win rate's 95% Wilson interval."""
    results = [r.steps[-1].info.get("result") if r.steps else None for r in rollouts]
    n, wins = len(results), results.count("win")
    return {
        "games": n,
        "win_rate": wins / max(n, 1),
        "win_rate_ci95": wilson(wins, n),
        "draw_rate": results.count("draw") / max(n, 1),
        "unfinished": results.count(None),
    }


async def warm_start(model: Any, tokenizer: Any, client: Any, args: argparse.Namespace) -> None:
    """SFT on the env's demonstrations, prompts tokenised as the agent sends them."""
    demos = TextArenaEnv(**GAMES[args.game].env).demonstrations(args.sft_moves, seed=args.seed)
    items = sft_items(tokenizer, [(d.prompt, d.answer) for d in demos])
    cfg = TrainerConfig(lr=args.sft_lr, max_seq_len=1024, micro_token_budget=16384)
    sft = sft_trainer(model, items, batch_size=16, seed=args.seed, publisher=ClientPublisher(client), cfg=cfg)
    await sft.train(args.sft_steps)
    client.restart_versions(0)  # the RL trainer publishes version = its step, counting from 1 again


def rl_trainer(model: Any, engine: RolloutEngine, client: Any, args: argparse.Namespace) -> Trainer:
    """GRPO's loss with per-turn credit: a move gets its reward-to-go, baselined per turn index in its group."""
    turn = PerTurnReturn(
        gamma=1.0, group_size=args.group_size, normalize_adv=True, positive_only=args.positive_only
    )
    algo = dataclasses.replace(
        make_grpo(group_size=args.group_size, positive_only=args.positive_only), credit_assigner=turn
    )
    sampling = SamplingConfig(temperature=1.0, max_tokens=args.max_new_tokens)
    games = SeededRequests(
        lambda seed: game(args.game, seed, sampling), per_step=args.prompts_per_step, next_seed=args.seed * 100_000,
        stop=EVAL_SEEDS,
    )  # fmt: skip
    cfg = TrainerConfig(
        lr=args.lr, lr_schedule="linear", warmup_steps=min(5, args.steps), total_steps=args.steps,
        max_seq_len=1024, micro_token_budget=16384, log_every=10,
    )  # fmt: skip
    logger = progress_and_metrics(
        Path(args.output_dir) / "metrics.jsonl", "[textarena]", total_steps=args.steps
    )
    return online_trainer(
        model, engine=engine, algo=algo, request_fn=games, max_steps=args.max_turns,
        concurrency=args.group_size * args.prompts_per_step, publisher=ClientPublisher(client), cfg=cfg,
        train_logger=logger,
    )  # fmt: skip


async def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ludic.testing import build_tiny_model

    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(args.seed)
    path = str(
        build_tiny_model(
            out / "initial_model",
            seed=args.seed,
            hidden_size=args.hidden_size,
            intermediate_size=3 * args.hidden_size,
        )
    )
    model, tokenizer = AutoModelForCausalLM.from_pretrained(path), AutoTokenizer.from_pretrained(path)
    client = TransformersChatClient(path, model_name="policy")
    engine = build_engine(client)
    eval_sampling = SamplingConfig(temperature=1.0, max_tokens=args.max_new_tokens)
    evaluator = Evaluator(
        engine=engine, requests=[game(args.game, EVAL_SEEDS + i, eval_sampling) for i in range(args.eval_games)],
        max_steps=args.max_turns, concurrency=args.eval_games, out_dir=out / "eval",
    )  # fmt: skip

    async def evaluate(step: int) -> dict[str, Any]:
        await evaluator.evaluate(step=step)
        return win_rate(evaluator.last_rollouts)

    start = time.perf_counter()
    report: dict[str, Any] = {"game": args.game, "seed": args.seed, "before": await evaluate(-1)}
    await warm_start(model, tokenizer, client, args)
    report["start_of_rl"] = await evaluate(0)
    await rl_trainer(model, engine, client, args).train(args.steps)
    report["after_rl"] = await evaluate(args.steps)
    report["seconds"] = time.perf_counter() - start
    (out / "summary.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def verdict(report: dict[str, Any]) -> str:
    """Whether RL alone moved the win rate: the interval after RL against the one at the start of RL."""
    start, after = report["start_of_rl"]["win_rate_ci95"], report["after_rl"]["win_rate_ci95"]
    if after[0] > start[1]:
        return "RL alone raised the win rate: its interval lies above the start of RL's"
    if after[1] < start[0]:
        return "RL lowered the win rate: its interval lies below the start of RL's"
    return "RL alone changed nothing measurable: the intervals overlap"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    report = asyncio.run(run(args))
    print(
        f"[textarena] {args.game}, seed {args.seed}: win rate on {args.eval_games} held-out games, 95% interval"
    )
    for phase in ("before", "start_of_rl", "after_rl"):
        r = report[phase]
        lo, hi = r["win_rate_ci95"]
        print(f"[textarena] {phase:11s} win {r['win_rate']:.2f} [{lo:.2f}, {hi:.2f}]  draw {r['draw_rate']:.2f}  "
              f"({r['unfinished']} unfinished)")  # fmt: skip
    print(f"[textarena] {verdict(report)}; {report['seconds']:.0f} s (evaluations + warm start + RL)")
    return report


if __name__ == "__main__":
    main()
