"""The ``ludic`` command line: sub-commands, config validation before anything starts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ludic.cli import build_parser, main

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "configs"


def test_list_prints_every_registry(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["list"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("envs: ") and "letter_repeat" in out[0]
    assert out[1] == "harnesses: plain, xml_move"
    assert out[2].startswith("protocols: ") and {"single_agent", "openai_program"} <= set(out[2][11:].split(", "))
    assert "grpo" in out[3] and out[3].startswith("algorithms: ")


def test_quickstart_flags_map_onto_its_config() -> None:
    args = build_parser().parse_args(
        [
            "quickstart",
            "--steps",
            "7",
            "--group-size",
            "4",
            "--algorithm",
            "cispo",
            "--seed",
            "3",
            "--output-dir",
            "o",
            "--model-dir",
            "m",
            "--lr",
            "0.002",
            "--no-live",
        ]
    )
    assert (args.steps, args.group_size, args.algorithm, args.seed) == (7, 4, "cispo", 3)
    assert (args.output_dir, args.model_dir, args.lr, args.live) == ("o", "m", 0.002, False)


@pytest.mark.parametrize("name", ["letter_repeat.toml", "letter_repeat.yaml"])
def test_train_dry_run_validates_shipped_configs(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", str(EXAMPLES / name), "--dry-run", "--steps", "5"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["steps"] == 5
    assert printed["env"] == {"name": "letter_repeat", "kwargs": {"count": 4, "letters": "abcdefgh"}, "reward": None}
    assert printed["algorithm"]["name"] == "grpo"


def test_invalid_config_exits_2_with_file_key_and_type(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "config.toml"
    bad.write_text('[model]\npath = "m"\n[env]\nname = "letter_repeat"\n[trainer]\nlr = "abc"\n')
    assert main(["train", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "config.toml: [trainer].lr: expected float, got str 'abc'" in err


def test_eval_reports_a_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", str(tmp_path / "nope.toml")]) == 2
    assert "nope.toml: no such file" in capsys.readouterr().err


def test_server_backend_builds_a_weight_pushing_http_client() -> None:
    from ludic.cli.runtime import make_client
    from ludic.config import parse_config
    from ludic.inference import VLLMChatClient

    cfg = parse_config(
        {
            "model": {"path": "m"},
            "env": {"name": "letter_repeat"},
            "inference": {"backend": "server", "server_url": "http://127.0.0.1:8123/"},
        },
        file="c.toml",
    )
    client = make_client(cfg)
    assert isinstance(client, VLLMChatClient)
    assert client.base_url == "http://127.0.0.1:8123" and client.port == 8123
    assert client.enable_weight_updates
