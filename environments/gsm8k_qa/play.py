"""Answer every problem of the local dataset through SingleAgentProtocol and print accuracy.

.venv/bin/python environments/gsm8k_qa/play.py --policy oracle
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gsm8k_qa import load_problems, make_agent, make_env, oracle_client
from ludic.inference.sampling import SamplingConfig
from ludic.interaction import SingleAgentProtocol


def tiny_model_client(workdir: Path):  # pragma: no cover - needs the embedded engine
    from ludic.inference import TransformersChatClient
    from ludic.testing import build_tiny_model

    return TransformersChatClient(str(build_tiny_model(workdir / "tiny")))


async def play(policy: str) -> float:
    client = (
        oracle_client()
        if policy == "oracle"
        else tiny_model_client(Path(tempfile.mkdtemp(prefix="ludic_tiny_")))
    )
    n = len(load_problems())
    correct = 0
    for i in range(n):
        agent = make_agent(client, sampling=SamplingConfig(max_tokens=64))
        (rollout,) = await SingleAgentProtocol(agent=agent).run(env=make_env(i), max_steps=1, sampling_seed=i)
        last = rollout.steps[-1]
        correct += bool(last.info.get("correct"))
        print(f"problem {i}: reward {last.reward:+.1f} answer {last.info.get('parsed_action')!r}")
    print(f"accuracy: {correct}/{n}")
    return correct / n


def main(argv: list[str] | None = None) -> float:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--policy", choices=["oracle", "tiny"], default="oracle")
    return asyncio.run(play(p.parse_args(argv).policy))


if __name__ == "__main__":
    main()
