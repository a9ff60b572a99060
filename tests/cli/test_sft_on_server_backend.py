"""``[sft]`` with ``[inference] backend = "server"``: the warm start publishes to Ludic's server (a real
subprocess on loopback) and RL goes on after it (it died with ``'VLLMChatClient' object has no attribute
'restart_versions'``)."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from ludic.cli import main

from .run_configs import write_qa_run_config

pytestmark = pytest.mark.integration


def test_sft_then_rl_on_ludics_server(tmp_path: Path, model_dir: Path, base_url: str) -> None:
    server = base_url.removesuffix("/v1")
    start_version = httpx.get(server + "/policy_version").json()["policy_version"]
    train, test, demos = tmp_path / "train.jsonl", tmp_path / "test.jsonl", tmp_path / "demos.jsonl"
    train.write_text("".join(json.dumps({"question": f"say {c}", "answer": "zz"}) + "\n" for c in "ab"))
    test.write_text(json.dumps({"question": "say y", "answer": "zz"}) + "\n")
    demos.write_text(json.dumps({"prompt": "say a", "answer": "zz"}) + "\n")
    tables = (f'[inference]\nbackend = "server"\nserver_url = "{server}"\n[trainer]\nmax_seq_len = 128\n'
              f'[sft]\nsteps = 2\nbatch_size = 1\nlr = 1e-2\ndemonstrations = "{demos}"\n')  # fmt: skip
    config = write_qa_run_config(tmp_path / "run.toml", model_dir, train=train, test=test, steps=1,
                                 max_tokens=3, plot=False, tables=tables)  # fmt: skip
    assert main(["train", str(config)]) == 0
    out = tmp_path / "out"
    records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if "train/loss" in r] == [1]  # the RL step ran
    assert records[0]["train/staleness_max"] == 0.0  # the SFT left no version ahead of the RL trainer
    # the SFT's publishes held the served version; the RL step published the next one
    assert (start_version, httpx.get(server + "/policy_version").json()["policy_version"]) == (0, 1)
    assert (out / "eval" / "eval_step_1_summary.json").is_file()
