"""What a run reads back of its own outputs, when they are not what it wrote: a resumed run's evaluation
summaries (empty, cut short, not an object, a value that is no number) are reported as not measured, naming the
file, instead of stopping the resume; the outputs marker is replaced whole or not at all, and a marker that
cannot be read is named as such when ``--fresh`` refuses."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from ludic.cli.warm_start import StartEvals, report_start_and_end, start_of_run
from ludic.training.run_outputs import MARKER, OutputsInTheWay, claim_outputs, claimed, clean_outputs

REWARD = "eval/avg_total_reward"


def _resumed_run(out_dir: Path) -> SimpleNamespace:
    """What ``start_of_run`` reads of a resumed ``[sft]`` run: its step, its config and its output folder."""
    return SimpleNamespace(trainer=SimpleNamespace(step=5), cfg=SimpleNamespace(sft=object()), out_dir=out_dir)


@pytest.mark.parametrize(("text", "why"), [("", "not a readable evaluation summary"),
                                           ('{"eval/avg_total_reward": 0.', "not a readable evaluation summary"),
                                           ("[0.5]", "a JSON list, not an evaluation summary")])  # fmt: skip
def test_a_resumed_run_reports_an_unreadable_summary_as_not_measured(
    tmp_path: Path, text: str, why: str, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "eval").mkdir()
    bad = tmp_path / "eval" / "eval_step_-1_summary.json"
    bad.write_text(text)
    (tmp_path / "eval" / "eval_step_0_summary.json").write_text(json.dumps({"step": 0, REWARD: 0.25}))
    with caplog.at_level(logging.WARNING):
        start = asyncio.run(start_of_run(_resumed_run(tmp_path)))
    assert start == StartEvals(before_sft=None, start_of_rl={"step": 0, REWARD: 0.25})
    assert f"{bad}: its result is reported as not measured, {why}" in caplog.text
    assert bad.read_text() == text  # left as it was
    report_start_and_end(start, {REWARD: 0.5}, tmp_path / "eval")
    assert f"held-out {REWARD} before training 0.250, after 0.500" in capsys.readouterr().out


def test_the_end_of_run_report_takes_summary_values_that_are_no_numbers(capsys: pytest.CaptureFixture[str]) -> None:
    start = StartEvals(before_sft={REWARD: "n/a", "eval/accuracy": None},
                       start_of_rl={REWARD: None, "eval/accuracy": 0.5})  # fmt: skip
    report_start_and_end(start, {REWARD: 0.75, "eval/accuracy": 1.0}, Path("eval"))
    reward, accuracy = capsys.readouterr().out.splitlines()
    assert "before SFT not measured, after SFT (start of RL) not measured, after 0.750" in reward
    assert "eval/accuracy before training not measured, after 1.000" in accuracy


CUT_SHORT = """
import resource, signal, sys
from pathlib import Path
from ludic.training.run_outputs import claim_outputs
out = Path(sys.argv[1])
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails (EFBIG) as on a full disk
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[2]), int(sys.argv[2])))
try:
    claim_outputs([out / f"output_{i:03d}" for i in range(50)], out)
except OSError as exc:
    print("write failed:", exc.errno)
"""


def test_a_marker_write_cut_short_keeps_the_earlier_marker(tmp_path: Path) -> None:
    claim_outputs([tmp_path / "metrics.jsonl", tmp_path / "eval"], tmp_path)
    before = (tmp_path / MARKER).read_text()
    done = subprocess.run([sys.executable, "-c", CUT_SHORT, str(tmp_path), str(len(before) + 10)],
                          capture_output=True, text=True, timeout=120, check=True)  # fmt: skip
    assert "write failed: 27" in done.stdout  # EFBIG
    assert (tmp_path / MARKER).read_text() == before
    assert claimed(tmp_path) == {"metrics.jsonl", "eval"}
    assert sorted(p.name for p in tmp_path.iterdir()) == [MARKER]  # no temporary file left behind


def test_fresh_names_an_unreadable_marker_instead_of_disowning_the_outputs(tmp_path: Path) -> None:
    claim_outputs([tmp_path / "metrics.jsonl"], tmp_path)
    (tmp_path / "metrics.jsonl").write_text('{"step": 1}\n')
    (tmp_path / MARKER).write_text('{"written_by": "ludic", "outp')
    with pytest.raises(OutputsInTheWay, match=f"is not known to be a Ludic run's: {tmp_path / MARKER} cannot be read"):
        clean_outputs([tmp_path / "metrics.jsonl"], owner_dir=tmp_path, checkpoint_dir=None)
    assert (tmp_path / "metrics.jsonl").exists()
