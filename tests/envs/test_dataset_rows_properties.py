"""``dataset_qa`` rows (issue 37): an integer question, a BOM, a corrupt parquet; and a property test.

Invariant (``read_rows`` / the ``dataset_qa`` env, on any JSON line or row): refused with
``DatasetRowsError`` naming the file, the row and the field, or accepted as an env that asks exactly the
row's question and holds exactly ``str(answer).strip()`` as its target; never another exception.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ludic.envs.dataset_rows import DatasetRowsError, dataset_qa_env, read_rows

GOOD = {"question": "1 + 1 = ?", "answer": "2"}
_names = itertools.count()


def _jsonl(path: Path, *rows: object, prefix: bytes = b"") -> Path:
    path.write_bytes(prefix + b"".join(json.dumps(r).encode() + b"\n" for r in rows))
    return path


@pytest.mark.parametrize(
    ("question", "named"),
    [(7, "a int (7)"), (1.5, "a float (1.5)"), (True, "a bool"), (["q"], "a list"), (" ", "a blank string")],
)
def test_a_question_that_is_not_a_non_blank_string_is_named(tmp_path, question, named):
    path = _jsonl(tmp_path / "d.jsonl", GOOD, {"question": question, "answer": "1"})
    with pytest.raises(DatasetRowsError) as info:
        dataset_qa_env(path=str(path))
    assert f"row 1 of {str(path)!r} (line 2): 'question' must be a non-blank string, got {named}" in str(
        info.value
    )
    with pytest.raises(DatasetRowsError, match="'question' must be a non-blank string"):
        dataset_qa_env(sample={"question": question, "answer": "1"})


@pytest.mark.parametrize("answer", [{"x": 1}, [1], float("nan"), float("inf")])
def test_an_answer_that_is_not_a_scalar_is_named(tmp_path, answer):
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(GOOD) + "\n" + json.dumps({"question": "q", "answer": answer}) + "\n")
    with pytest.raises(
        DatasetRowsError, match=r"row 1 of .* \(line 2\): 'answer' must be a string, a finite number"
    ):
        dataset_qa_env(path=str(path))


def test_a_utf8_byte_order_mark_is_skipped(tmp_path):
    env = dataset_qa_env(
        path=str(
            _jsonl(tmp_path / "bom.jsonl", GOOD, {"question": "q2", "answer": 4}, prefix=b"\xef\xbb\xbf")
        )
    )
    assert [dict(r) for r in env.rows] == [GOOD, {"question": "q2", "answer": 4}]
    assert env.reset(seed=0)["agent_0"][0] == "1 + 1 = ?"
    # only at the start of the file: one inside it is not JSON
    path = tmp_path / "mid.jsonl"
    path.write_bytes(json.dumps(GOOD).encode() + b"\n\xef\xbb\xbf" + json.dumps(GOOD).encode() + b"\n")
    with pytest.raises(DatasetRowsError, match=r"line 2 of .* is not UTF-8 JSON"):
        read_rows(path, ("question", "answer"))


@pytest.mark.parametrize("suffix", [".parquet", ".json"])
def test_a_corrupt_file_is_named(tmp_path, suffix):
    path = tmp_path / f"broken{suffix}"
    path.write_bytes(b"PAR1\x00\x01garbage" * 10 if suffix == ".parquet" else b'[{"question": "q", ')
    with pytest.raises(DatasetRowsError) as info:
        dataset_qa_env(path=str(path))
    assert f"dataset_qa: {str(path)!r} cannot be read as {suffix[1:]}:" in str(info.value)


def test_missing_fields_are_still_key_errors_and_dataset_rows_errors(tmp_path):
    path = _jsonl(tmp_path / "d.jsonl", {"answer": "3"})
    with pytest.raises(KeyError) as info:
        read_rows(path, ("question", "answer"))
    assert isinstance(info.value, DatasetRowsError)
    assert (
        str(info.value)
        == f"dataset_qa: row 0 of {str(path.resolve())!r} (line 1) has no ['question'] field; fields: ['answer']"
    )


# ---- the property ------------------------------------------------------------------------------------

_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False)
    | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=5,
)
_rows = (
    st.dictionaries(
        st.sampled_from(["question", "answer", "id", "other"]) | st.text(max_size=5), _json, max_size=4
    )
    | _json
)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rows=st.lists(_rows, min_size=1, max_size=4), bom=st.booleans())
def test_any_jsonl_is_refused_naming_what_or_asks_exactly_its_rows(tmp_path, rows, bom):
    path = tmp_path / f"p{next(_names)}.jsonl"  # a new file each time: rows are cached by (path, mtime, size)
    _jsonl(path, *rows, prefix=b"\xef\xbb\xbf" if bom else b"")
    try:
        env = dataset_qa_env(path=str(path))
    except DatasetRowsError as exc:
        assert str(path.resolve()) in str(exc)
        assert any(f in str(exc) for f in ("'question'", "'answer'", "['question'", "['answer'", "['question', 'answer']", "is a JSON"))  # fmt: skip
        return
    assert [dict(r) for r in env.rows] == rows  # JSON round trip: exactly the rows written
    for seed, row in enumerate(rows):
        obs = env.reset(seed=seed)
        assert (
            obs["agent_0"][0] == row["question"]
            and isinstance(row["question"], str)
            and row["question"].strip()
        )
        answer = row["answer"]
        assert answer is None or type(answer) in (str, bool, int) or math.isfinite(answer)
        assert env.target_answer == (None if answer is None else str(answer).strip())


@given(st.binary(max_size=120))
def test_any_bytes_as_a_jsonl_file_are_refused_naming_the_file_or_read(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("b") / "b.jsonl"
    path.write_bytes(data)
    try:
        rows = read_rows(path, ("question", "answer"))
    except DatasetRowsError as exc:
        assert str(path.resolve()) in str(exc)
        return
    assert all(isinstance(r["question"], str) and r["question"].strip() for r in rows)
