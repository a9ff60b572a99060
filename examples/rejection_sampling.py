"""Rejection sampling: play Tic-Tac-Toe, keep only the winning trajectories, write training-ready JSONL.

Each kept rollout is written as one JSON line (``rollout_to_dict``) carrying the exact token ids of every
move, so ``OfflineBatchSource`` reads the file straight back into SAW items for SFT (``make_sft``).

    .venv/bin/python examples/rejection_sampling.py --episodes 64 --out runs/ttt_wins.jsonl
    .venv/bin/python examples/rejection_sampling.py --policy tiny --model path/to/model

``--policy heuristic`` (default) is a scripted expert: its replies are tokenised with the policy's
tokenizer, so the traces are real token ids of that tokenizer (no sampling log-probs: these are
demonstrations, not samples). ``--policy tiny`` samples from a model on the embedded engine.
A data-preparation demo: it trains nothing itself (``examples/tic_tac_toe`` trains on such games).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
from pathlib import Path
from typing import Any

from ludic.agents import Agent
from ludic.context import FullDialog
from ludic.envs import TicTacToeEnv
from ludic.envs.tic_tac_toe_board import bot_move
from ludic.inference import ChatCompletionRequest, InferenceSpec, SamplingConfig, TransformersChatClient
from ludic.interaction import SingleAgentProtocol
from ludic.parsers import xml_tag_parser
from ludic.testing import build_tiny_model
from ludic.training.batching import RolloutEngine, rollout_to_dict
from ludic.training.batching.jsonl import dumps
from ludic.training.types import EnvSpec, ProtocolSpec, RolloutRequest
from ludic.types import ChatResponse

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # for environments/
from environments.tic_tac_toe import board_from_obs  # noqa: E402


class ExpertClient:
    """Plays the heuristic move and returns it as the policy tokenizer's ids (plus EOS)."""

    def __init__(self, tokenizer: Any, seed: int = 0) -> None:
        self.tokenizer = tokenizer
        self.rng = random.Random(seed)

    async def complete(self, request: ChatCompletionRequest) -> tuple[ChatResponse, dict[str, Any]]:
        last = next(m["content"] for m in reversed(request.messages) if m["role"] == "user")
        board, mark = board_from_obs(last)
        text = f"<move>{bot_move(board, mark, 'heuristic', self.rng)}</move>"
        ids = [*self.tokenizer.encode(text, add_special_tokens=False), self.tokenizer.eos_token_id]
        prompt = request.prompt_token_ids or []
        return ChatResponse(text, "stop", list(prompt), ids, None, 0), {}

    def sync_weights(self, params, *, timeout_s: float = 600.0, version: int | None = None) -> str:
        raise NotImplementedError("the scripted expert has no weights")


def make_engine(client: Any, tokenizer: Any, opponent: str) -> RolloutEngine:
    def protocol() -> SingleAgentProtocol:
        parser = xml_tag_parser("move", success_reward=0.0, error_reward=-1.0)
        agent = Agent(client=client, model="policy", ctx=FullDialog(), parser=parser, tokenizer=tokenizer)
        return SingleAgentProtocol(agent=agent)

    return RolloutEngine(
        env_registry={"tic_tac_toe": lambda: TicTacToeEnv(opponent=opponent)},
        protocol_registry={"single": protocol},
    )


async def collect_wins(engine: RolloutEngine, episodes: int, seed: int, max_tokens: int) -> tuple[list, int]:
    sampling = InferenceSpec(SamplingConfig(temperature=1.0, max_tokens=max_tokens))
    requests = [
        RolloutRequest(EnvSpec("tic_tac_toe"), ProtocolSpec("single"), env_seed=seed + i,
                       sampling_seed=seed + i, inference=sampling)
        for i in range(episodes)
    ]  # fmt: skip
    rollouts = await engine.generate_rollouts(requests=requests, max_steps=12, concurrency=32)
    wins = [r for r in rollouts if r.steps and r.steps[-1].info.get("result") == "win"]
    return wins, len(rollouts)


def main(argv: list[str] | None = None) -> dict[str, int]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", help="model directory (default: build a tiny one offline)")
    parser.add_argument("--policy", choices=["heuristic", "tiny"], default="heuristic")
    parser.add_argument("--opponent", default="random", help="built-in opponent: random or heuristic")
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="runs/rejection_sampling/wins.jsonl")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="ludic-rs-") as tmp:  # a built tiny model is removed once loaded
        engine_client = TransformersChatClient(args.model or str(build_tiny_model(tmp)))
    client = engine_client if args.policy == "tiny" else ExpertClient(engine_client.tokenizer, args.seed)
    engine = make_engine(client, engine_client.tokenizer, args.opponent)
    wins, played = asyncio.run(collect_wins(engine, args.episodes, args.seed, args.max_tokens))

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as f:
        for rollout in wins:
            f.write(dumps(rollout_to_dict(rollout)) + "\n")
    print(f"kept {len(wins)} winning trajectories of {played} episodes -> {out}")
    return {"played": played, "kept": len(wins)}


if __name__ == "__main__":
    main()
