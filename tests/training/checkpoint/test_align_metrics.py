"""``align_metrics``: after a resume, ``metrics.jsonl`` holds one record per step up to the checkpoint."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ludic.training.checkpoint.resume import Resumed, align_metrics


def _write(path: Path, steps: list[int], tail: str = "") -> None:
    path.write_text("".join(json.dumps({"step": s, "train/loss": float(s)}) + "\n" for s in steps) + tail)


def _steps(path: Path) -> list[int]:
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


def test_the_checkpoint_step_missing_its_record_gets_the_checkpoints_stats(tmp_path: Path) -> None:
    jsonl = tmp_path / "metrics.jsonl"
    _write(jsonl, [1, 2, 3], tail='{"step": 4, "tr')  # killed while writing step 4's line
    report = align_metrics(jsonl, Resumed(step=4, stats={"train/loss": 4.5, "eval/accuracy": 0.25}))
    assert (report.dropped, report.restored) == (1, True)
    assert _steps(jsonl) == [1, 2, 3, 4]
    assert json.loads(jsonl.read_text().splitlines()[-1]) == {"step": 4, "train/loss": 4.5, "eval/accuracy": 0.25}


def test_records_after_the_checkpoint_go_and_its_own_record_stays_once(tmp_path: Path) -> None:
    jsonl = tmp_path / "metrics.jsonl"
    _write(jsonl, [1, 2, 3, 4, 5, 6])
    report = align_metrics(jsonl, Resumed(step=4, stats={"train/loss": 99.0}))
    assert (report.dropped, report.restored) == (2, False)
    assert _steps(jsonl) == [1, 2, 3, 4]
    assert json.loads(jsonl.read_text().splitlines()[-1])["train/loss"] == 4.0  # the logged line, not the saved one


def test_a_step_that_was_not_due_to_log_gets_no_record(tmp_path: Path) -> None:
    jsonl = tmp_path / "metrics.jsonl"
    _write(jsonl, [2, 4])
    report = align_metrics(jsonl, Resumed(step=5, stats={"train/loss": 5.0}), log_every=2)
    assert (report.dropped, report.restored) == (0, False)
    assert _steps(jsonl) == [2, 4]


def test_a_checkpoint_without_stats_restores_nothing(tmp_path: Path) -> None:
    jsonl = tmp_path / "metrics.jsonl"
    _write(jsonl, [1, 2])
    assert not align_metrics(jsonl, Resumed(step=3)).restored  # e.g. saved by save_checkpoint(), outside a step
    assert _steps(jsonl) == [1, 2]


# ---- any metrics.jsonl: nothing but later steps and unreadable lines goes ---------------------------------

_TEXT = st.characters(blacklist_categories=("Cs",), blacklist_characters="\n")
_RECORD = st.builds(lambda step, loss: json.dumps({"step": step, "train/loss": loss}), st.integers(-2, 12), st.floats())
_ODD_JSON = st.sampled_from(['[1, 2]', '"step"', "7", "null", '{"step": true}', '{"step": "4"}', '{"note": "x"}'])
_LINE = st.one_of(_RECORD, _ODD_JSON, st.text(_TEXT, max_size=30), st.just('{"step": 9, "tr'))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    lines=st.lists(_LINE, max_size=12),
    step=st.integers(0, 10),
    log_every=st.integers(1, 3),
    stats=st.one_of(st.just({}), st.just({"train/loss": 0.5})),
    junk=st.sampled_from([b"", b"\xff\xfe{", b"\r"]),
)
def test_any_metrics_file_keeps_every_readable_earlier_line_and_one_record_of_the_step(
    tmp_path: Path, lines: list[str], step: int, log_every: int, stats: dict, junk: bytes
) -> None:
    jsonl = tmp_path / "metrics.jsonl"
    raw = [line.encode() for line in lines] + ([junk] if junk else [])
    jsonl.write_bytes(b"".join(line + b"\n" for line in raw))

    def kept(line: bytes) -> bool:
        try:
            record = json.loads(line.decode(errors="surrogateescape"))
        except ValueError:
            return False  # not JSON: a line cut short by a kill
        later = isinstance(record, dict) and type(record.get("step")) is int and record["step"] > step
        return not later

    expected = [line for line in raw if kept(line)]
    report = align_metrics(jsonl, Resumed(step=step, stats=stats), log_every=log_every)

    after = jsonl.read_bytes().split(b"\n")[:-1]
    assert after[: len(expected)] == expected  # byte for byte, in order
    assert report.dropped == len(raw) - len(expected)
    logged_before = any(line.startswith(b'{"step": %d,' % step) for line in expected)
    should_restore = bool(stats) and step > 0 and step % log_every == 0 and not logged_before
    assert report.restored == should_restore
    assert after[len(expected) :] == ([json.dumps({"step": step, **stats}).encode()] if should_restore else [])
