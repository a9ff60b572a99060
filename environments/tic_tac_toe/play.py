"""Play Tic-Tac-Toe episodes through SingleAgentProtocol and print each result.

.venv/bin/python environments/tic_tac_toe/play.py --episodes 5 --policy heuristic
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ludic.inference.sampling import SamplingConfig
from ludic.interaction import SingleAgentProtocol
from tic_tac_toe import heuristic_client, make_agent, make_env


def tiny_model_client(workdir: Path):  # pragma: no cover - needs the embedded engine
    from ludic.inference import TransformersChatClient
    from ludic.testing import build_tiny_model

    return TransformersChatClient(str(build_tiny_model(workdir / "tiny")))


async def play(episodes: int, seed: int, opponent: str, policy: str, max_steps: int) -> Counter:
    results: Counter = Counter()
    if policy == "heuristic":
        client = heuristic_client(seed)
    else:
        with tempfile.TemporaryDirectory(prefix="ludic_tiny_") as tmp:  # removed once the engine loaded it
            client = tiny_model_client(Path(tmp))
    for ep in range(episodes):
        agent = make_agent(client, sampling=SamplingConfig(max_tokens=16))  # <move>N</move> is 13 bytes
        protocol = SingleAgentProtocol(agent=agent)  # fresh agent per episode
        (rollout,) = await protocol.run(
            env=make_env(opponent=opponent), max_steps=max_steps, env_seed=seed + ep, sampling_seed=seed + ep
        )
        result = rollout.steps[-1].info.get("result", "unfinished")
        results[result] += 1
        print(f"episode {ep}: {result:10s} reward {rollout.total_reward:+.2f} steps {rollout.length}")
    return results


def main(argv: list[str] | None = None) -> Counter:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--episodes", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--opponent", choices=["random", "heuristic"], default="random")
    p.add_argument("--policy", choices=["heuristic", "tiny"], default="heuristic")
    p.add_argument("--max-steps", type=int, default=9)
    args = p.parse_args(argv)
    results = asyncio.run(play(args.episodes, args.seed, args.opponent, args.policy, args.max_steps))
    print("results:", dict(results))
    return results


if __name__ == "__main__":
    main()
