"""Tic-Tac-Toe against the random bot: SFT warm start on random legal moves, then GRPO, then held-out games.

    .venv/bin/python examples/tic_tac_toe/train_tic_tac_toe.py                 # tiny model, CPU, about 3 min
    .venv/bin/python examples/tic_tac_toe/train_tic_tac_toe.py --model Qwen/Qwen2.5-0.5B-Instruct --device cuda

Written against the public API only: ``TicTacToeEnv``, an ``Agent`` that sees the latest board
(``LatestBoard``: the observation holds the whole state, so the history only costs), ``sft_data``
for the warm start (uniformly random legal moves: a short warm start that teaches some of the format
and legality and no strategy; ``--sft-player heuristic``: the heuristic's moves), ``make_grpo``'s loss with per-turn credit (``PerTurnReturn``) and ``RolloutBatchSource`` (which forms the groups), ``Trainer`` with a warm-up + linear-decay schedule,
and an ``Evaluator`` on held-out games. It prints win rate and bad-move rate (illegal moves +
replies without a ``<move>`` tag, per move) with 95% intervals before training, at the start of RL
(after the warm start) and at the end, and writes ``metrics.jsonl``, ``summary.json`` and
``final_model/`` to ``--output-dir``.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from board_context import MOVE_PARSER, LatestBoard
from demonstrations import demonstration_items

from ludic.agents import Agent
from ludic.distributed import ClientPublisher
from ludic.envs import TicTacToeEnv
from ludic.eval import Evaluator, wilson
from ludic.inference import InferenceSpec, SamplingConfig
from ludic.interaction import SingleAgentProtocol
from ludic.training import (
    EnvSpec,
    PerTurnReturn,
    ProtocolSpec,
    RolloutEngine,
    RolloutRequest,
    SeededRequests,
    TrainerConfig,
    make_grpo,
    online_trainer,
    sft_trainer,
)
from ludic.training.loggers import before_after, progress_and_metrics

EVAL_SEEDS = 1_000_000  # held-out games; demonstrations and RL use seeds far below
SFT_SEEDS = 500_000


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="model directory or hub name (default: build a tiny model)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--output-dir", default="runs/tic_tac_toe")
    p.add_argument("--seed", type=int, default=0, help="fixes the tiny model, the data order and sampling")
    p.add_argument("--opponent", default="random", choices=["random", "heuristic"])
    p.add_argument("--sft-games", type=int, default=200, help="games used as demonstrations")
    p.add_argument(
        "--sft-player", default="random", choices=["random", "heuristic"],
        help="X's moves in the demonstrations: random legal moves (format and legality, no strategy), or the heuristic's",
    )  # fmt: skip
    p.add_argument("--sft-steps", type=int, default=50, help="SFT warm-start steps (0 to skip)")
    p.add_argument("--sft-lr", type=float, default=1e-3)
    p.add_argument(
        "--credit", default="turn", choices=["turn", "episode"],
        help="turn: each move gets its reward-to-go, baselined per turn index in its group; episode: plain GRPO",
    )  # fmt: skip
    p.add_argument(
        "--positive-only", action=argparse.BooleanOptionalAction, default=True,
        help="clamp advantages at 0: reinforce better-than-average moves, never push replies down",
    )  # fmt: skip
    p.add_argument(
        "--gamma", type=float, default=1.0,
        help="per-turn credit's discount: 1 gives every move the whole reward-to-go, 0 only its own reward",
    )  # fmt: skip
    p.add_argument(
        "--board-only", action=argparse.BooleanOptionalAction, default=True,
        help="the agent sees only the board view, not the env's notes (which name taken cells with digits)",
    )  # fmt: skip
    p.add_argument("--steps", type=int, default=60, help="GRPO steps")
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--prompts-per-step", type=int, default=2)
    p.add_argument(
        "--max-turns", type=int, default=9,
        help="model calls per game, retries included (X moves at most 5 times); a game cut short has no result",
    )  # fmt: skip
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--warmup-steps", type=int, default=10)
    p.add_argument("--eval-games", type=int, default=256, help="held-out games per evaluation (95%% CI about +-0.06)")
    p.add_argument(
        "--eval-temperature",
        type=float,
        default=1.0,
        help="1.0: the policy's expected play, seeded (greedy play of a tiny model repeats one illegal move)",
    )
    p.add_argument("--max-new-tokens", type=int, default=16, help="<move>N</move> is 14 tokens + end of turn")
    p.add_argument("--log-every", type=int, default=5)
    return p.parse_args(argv)


def build_engine(client: Any, model: str, *, board_only: bool = True) -> RolloutEngine:
    """Env + agent registries: a fresh agent per episode (agents keep state)."""

    def protocol() -> SingleAgentProtocol:
        agent = Agent(client=client, model=model, ctx=LatestBoard(board_only=board_only), parser=MOVE_PARSER)
        return SingleAgentProtocol(agent=agent, use_env_sysprompt=False)  # the warm start teaches the format

    return RolloutEngine(env_registry={"ttt": TicTacToeEnv}, protocol_registry={"agent": protocol})


def rl_algorithm(credit: str, group_size: int, *, positive_only: bool, gamma: float = 1.0) -> Any:
    """GRPO's loss (token-level clip) with per-turn or per-episode credit; the group size is given once here."""
    algo = make_grpo(group_size=group_size, positive_only=positive_only)
    if credit == "episode":
        return algo
    # An illegal move is scored where it happens (-1), not smeared over the whole game; the win (+1)
    # still reaches every move before it (gamma 1).
    turn = PerTurnReturn(gamma=gamma, group_size=group_size, normalize_adv=True, positive_only=positive_only)
    return dataclasses.replace(algo, name="grpo_per_turn", credit_assigner=turn)


def game(seed: int, opponent: str, sampling: SamplingConfig) -> RolloutRequest:
    return RolloutRequest(
        EnvSpec("ttt", {"opponent": opponent}), ProtocolSpec("agent"), env_seed=seed, sampling_seed=seed,
        inference=InferenceSpec(sampling),
    )  # fmt: skip


def ratio_interval(bad: list[int], moves: list[int], z: float = 1.96) -> list[float]:
    """95% interval for sum(bad) / sum(moves) with games as the unit (moves in a game are not independent)."""
    n, total = len(moves), sum(moves)
    if n < 2 or total == 0:
        return [0.0, 1.0]
    r = sum(bad) / total
    var = n / (n - 1) * sum((b - r * m) ** 2 for b, m in zip(bad, moves)) / total**2
    return [max(0.0, r - z * math.sqrt(var)), min(1.0, r + z * math.sqrt(var))]


def summarise(rollouts: list[Any]) -> dict[str, Any]:
    """Win/draw rate per game and bad-move rate per move (illegal or unparsable), with 95% intervals."""
    results = [r.steps[-1].info.get("result") for r in rollouts]
    moves = [len(r.steps) for r in rollouts]
    bad = [sum(bool(s.info.get("parse_error") or s.info.get("illegal_move")) for s in r.steps) for r in rollouts]
    unparsed = [sum(bool(s.info.get("parse_error")) for s in r.steps) for r in rollouts]
    n, total = max(len(rollouts), 1), max(sum(moves), 1)
    return {
        "games": len(rollouts),
        "win_rate": results.count("win") / n,
        "win_rate_ci95": wilson(results.count("win"), len(rollouts)),
        "draw_rate": results.count("draw") / n,
        "bad_move_rate": sum(bad) / total,
        "bad_move_rate_ci95": ratio_interval(bad, moves),
        "parse_error_rate": sum(unparsed) / total,
        "avg_reward": sum(r.total_reward for r in rollouts) / n,
    }


async def evaluate(evaluator: Evaluator, step: int) -> dict[str, float]:
    await evaluator.evaluate(step=step)
    return summarise(evaluator.last_rollouts)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from ludic.inference import TransformersChatClient

    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(args.seed)
    model_path = args.model
    if model_path is None:
        from ludic.testing import build_tiny_model

        model_path = str(build_tiny_model(out / "initial_model", seed=args.seed))
    model = AutoModelForCausalLM.from_pretrained(model_path).to(args.device)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    client = TransformersChatClient(model_path, device=args.device, model_name="policy")
    engine = build_engine(client, "policy", board_only=args.board_only)
    eval_sampling = SamplingConfig(temperature=args.eval_temperature, max_tokens=args.max_new_tokens)
    evaluator = Evaluator(
        engine=engine, requests=[game(EVAL_SEEDS + i, args.opponent, eval_sampling) for i in range(args.eval_games)],
        max_steps=args.max_turns, concurrency=args.eval_games, out_dir=out / "eval",
    )  # fmt: skip
    report: dict[str, Any] = {"initial": await evaluate(evaluator, -1)}
    start, cpu_start = time.perf_counter(), time.process_time()

    if args.sft_steps:  # SFT warm start on the heuristic's moves
        items = demonstration_items(
            tokenizer, seeds=range(SFT_SEEDS, SFT_SEEDS + args.sft_games), player=args.sft_player,
            board_only=args.board_only,
        )
        sft_cfg = TrainerConfig(
            model_device=args.device, lr=args.sft_lr, max_seq_len=256, micro_token_budget=8192
        )
        sft = sft_trainer(model, items, batch_size=16, seed=args.seed, publisher=ClientPublisher(client), cfg=sft_cfg)
        await sft.train(args.sft_steps)
        client.restart_versions(0)  # the RL trainer publishes version = its step, counting from 1 again
    report["start_of_rl"] = await evaluate(evaluator, 0)

    sampling = SamplingConfig(temperature=1.0, max_tokens=args.max_new_tokens)
    algo = rl_algorithm(args.credit, args.group_size, positive_only=args.positive_only, gamma=args.gamma)
    games = SeededRequests(
        lambda seed: game(seed, args.opponent, sampling), per_step=args.prompts_per_step,
        next_seed=args.seed * 100_000,
    )  # fmt: skip
    cfg = TrainerConfig(
        model_device=args.device, lr=args.lr, lr_schedule="linear", warmup_steps=min(args.warmup_steps, args.steps),
        total_steps=args.steps, max_seq_len=256, micro_token_budget=8192, log_every=args.log_every,
    )  # fmt: skip
    logger = progress_and_metrics(out / "metrics.jsonl", "[tic_tac_toe]", total_steps=args.steps)
    trainer = online_trainer(
        model, engine=engine, algo=algo, request_fn=games, max_steps=args.max_turns,
        concurrency=args.group_size * args.prompts_per_step, publisher=ClientPublisher(client), cfg=cfg,
        train_logger=logger,
    )  # fmt: skip
    history = await trainer.train(args.steps)
    report["end"] = await evaluate(evaluator, args.steps)
    report["seconds"] = time.perf_counter() - start
    report["cpu_seconds"] = time.process_time() - cpu_start  # this process's CPU time: wall time on a busy machine overstates
    report["rl_seconds_per_step"] = sum(h["perf/step_seconds"] for h in history) / max(len(history), 1)
    model.save_pretrained(out / "final_model")
    tokenizer.save_pretrained(out / "final_model")
    (out / "summary.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def main(argv: list[str] | None = None) -> dict[str, Any]:
    report = asyncio.run(run(parse_args(argv)))
    for phase in ("initial", "start_of_rl", "end"):
        r = report[phase]
        win, bad = r["win_rate_ci95"], r["bad_move_rate_ci95"]
        print(f"[tic_tac_toe] {phase:12s} win {r['win_rate']:.2f} [{win[0]:.2f}, {win[1]:.2f}]  draw {r['draw_rate']:.2f}  "
              f"bad moves {r['bad_move_rate']:.2f} [{bad[0]:.2f}, {bad[1]:.2f}]  parse errors {r['parse_error_rate']:.2f}"
              f"  ({r['games']} games)")  # fmt: skip
    print(before_after("win rate, start of RL -> end:", report["start_of_rl"]["win_rate"], report["end"]["win_rate"],
                       prefix="[tic_tac_toe]", precision=2))  # fmt: skip
    print(f"[tic_tac_toe] {report['seconds']:.0f} s, {report['cpu_seconds']:.0f} s of CPU (warm start + RL + evals)")
    return report


if __name__ == "__main__":
    main()
