"""OfflineBatchSource: in-memory items, SAW-item and rollout JSONL, streaming, seeded shuffle, epochs."""

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ludic.training.batching import OfflineBatchSource, jsonl
from ludic.training.batching.jsonl import rollout_to_dict, saw_item_to_dict, write_jsonl
from ludic.training.credit.assigners import EpisodicReturn
from ludic.training.types import SAWItem
from ludic.types import Rollout, Step, TokenTrace


def _item(i: int) -> SAWItem:
    return SAWItem([i, i + 1, i + 2], [1, 1, 1], [0, 1, 1], 1.0, {"rollout_id": f"r{i}"})


async def test_in_memory_items_come_back_in_batches_and_epochs_end():
    source = OfflineBatchSource([_item(i) for i in range(5)], batch_size=2, epochs=1)
    sizes = [len((await source.next_batch()).items) for _ in range(3)]
    assert sizes == [2, 2, 1]
    with pytest.raises(StopAsyncIteration):
        await source.next_batch()


async def test_saw_item_jsonl_round_trips(tmp_path):
    path = tmp_path / "items.jsonl"
    write_jsonl(path, [saw_item_to_dict(_item(i)) for i in range(3)])
    batch = await OfflineBatchSource(path, batch_size=3).next_batch()
    assert [it.input_ids for it in batch.items] == [[0, 1, 2], [1, 2, 3], [2, 3, 4]]
    assert batch.items[1].meta == {"rollout_id": "r1"}


async def test_rollout_jsonl_becomes_sft_items_with_constant_credit(tmp_path):
    trace = TokenTrace([5, 6], [7, 8], [-0.1, -0.2], "stop")
    rollout = Rollout(steps=[Step(0, "o", "a", None, 0.0, False, True, {}, trace)])
    path = tmp_path / "rollouts.jsonl"
    write_jsonl(path, [rollout_to_dict(rollout)])
    (item,) = (await OfflineBatchSource(path, batch_size=4, epochs=1).next_batch()).items
    assert item.input_ids == [5, 6, 7, 8] and item.action_mask == [0, 0, 1, 1] and item.weight == 1.0
    assert item.attachments.actor_logps.token_logps == [-0.1, -0.2]


def _count_parsed_records(monkeypatch) -> dict:
    read = {"n": 0}
    real = jsonl.iter_jsonl_numbered

    def counting(p):
        for numbered in real(p):
            read["n"] += 1
            yield numbered

    monkeypatch.setattr("ludic.training.batching.offline_batch_source.iter_jsonl_numbered", counting)
    return read


async def test_files_are_streamed_not_loaded_whole(tmp_path, monkeypatch):
    path = tmp_path / "big.jsonl"
    write_jsonl(path, [saw_item_to_dict(_item(i)) for i in range(1000)])
    read = _count_parsed_records(monkeypatch)
    source = OfflineBatchSource(path, batch_size=4)
    await source.next_batch()
    assert read["n"] <= 5  # only what the first batch needed was parsed


async def test_shuffling_a_file_reads_only_a_buffer_ahead(tmp_path, monkeypatch):
    path = tmp_path / "big.jsonl"
    write_jsonl(path, [saw_item_to_dict(_item(i)) for i in range(1000)])
    read = _count_parsed_records(monkeypatch)
    source = OfflineBatchSource(path, batch_size=4, shuffle=True, shuffle_buffer=16, seed=1)
    first = [it.input_ids[0] for it in (await source.next_batch()).items]
    assert read["n"] <= 16 + 4 and all(i < 20 for i in first)


async def test_bounded_shuffle_is_seeded(tmp_path):
    items = [_item(i) for i in range(20)]

    async def order(seed):
        source = OfflineBatchSource(items, batch_size=20, shuffle=True, seed=seed, shuffle_buffer=5)
        return [it.input_ids[0] for it in (await source.next_batch()).items]

    assert await order(3) == await order(3)
    assert sorted(await order(3)) == list(range(20)) and await order(3) != list(range(20))


async def test_bad_lines_name_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"input_ids": [1], "action_mask": [1]}\n{oops\n')
    source = OfflineBatchSource(path, batch_size=5)
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not valid JSON"):
        await source.next_batch()


def test_a_byte_order_mark_at_the_start_is_skipped_and_one_later_is_named(tmp_path):
    """Before, a file saved with a UTF-8 BOM (Windows editors) failed at line 1: "Unexpected UTF-8 BOM"."""
    line = '{"input_ids": [1, 2], "action_mask": [0, 1]}\n'
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + line.encode() + line.encode())
    assert [n for n, _ in jsonl.iter_jsonl_numbered(path)] == [1, 2]
    path.write_bytes(line.encode() + b"\xef\xbb\xbf" + line.encode())  # a BOM mid-file is not a file's start
    with pytest.raises(ValueError, match=r"bom.jsonl:2: not valid JSON"):
        list(jsonl.iter_jsonl_numbered(path))


def test_missing_file_and_empty_data_are_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file"):
        OfflineBatchSource(tmp_path / "nope.jsonl", batch_size=1)
    with pytest.raises(ValueError, match="non-empty list"):
        OfflineBatchSource([], batch_size=1)


async def test_valid_json_that_is_not_an_item_names_file_and_line(tmp_path):
    path = tmp_path / "items.jsonl"
    path.write_text('{"input_ids": [1], "action_mask": [1]}\n\n{"input_ids": [1, 2]}\n')
    with pytest.raises(ValueError, match=r"items.jsonl:3: bad SAW item record: .*lacks \['action_mask'\]"):
        await OfflineBatchSource(path, batch_size=5).next_batch()


async def test_rollout_steps_without_token_traces_name_file_and_line(tmp_path):
    path = tmp_path / "rollouts.jsonl"
    write_jsonl(path, [rollout_to_dict(Rollout(steps=[Step(0, "o", "a", None, 1.0, False, True, {}, None)]))])
    with pytest.raises(
        ValueError, match=r"rollouts.jsonl:1: bad rollout record: missing rollout-time token trace"
    ):
        await OfflineBatchSource(path, batch_size=5).next_batch()


async def test_several_files_are_read_in_order_and_epochs_repeat_them(tmp_path):
    paths = [tmp_path / "a.jsonl", tmp_path / "b.jsonl"]
    write_jsonl(paths[0], [saw_item_to_dict(_item(0))])
    write_jsonl(paths[1], [saw_item_to_dict(_item(1)), saw_item_to_dict(_item(2))])
    source = OfflineBatchSource(paths, batch_size=2, epochs=2)
    got = [[it.input_ids[0] for it in (await source.next_batch()).items] for _ in range(3)]
    assert got == [[0, 1], [2, 0], [1, 2]]
    with pytest.raises(StopAsyncIteration):
        await source.next_batch()


async def test_rollouts_take_weights_from_a_given_credit_assigner(tmp_path):
    trace = TokenTrace([5], [6], None, "stop")
    steps = [Step(i, "o", "a", "o", r, False, i == 1, {}, trace) for i, r in enumerate([0.5, 2.0])]
    path = tmp_path / "rollouts.jsonl"
    write_jsonl(path, [rollout_to_dict(Rollout(steps=steps))])
    source = OfflineBatchSource(path, batch_size=2, credit_assigner=EpisodicReturn())
    assert [it.weight for it in (await source.next_batch()).items] == [2.5, 2.5]  # total return per step


@pytest.mark.parametrize(
    ("line", "why"),
    [
        (b"[1, 2]", "expected a JSON object per line, got array"),
        (b"null", "expected a JSON object per line, got null"),
        (b'{"input_ids": [1], "action_mask": [1]}\xff\xfe', r"not UTF-8 text \(byte 38"),
    ],
)
async def test_a_line_that_is_not_a_json_object_names_file_and_line(tmp_path, line, why):
    path = tmp_path / "items.jsonl"
    path.write_bytes(b'{"input_ids": [1], "action_mask": [1]}\n' + line + b"\n")
    with pytest.raises(ValueError, match=rf"items.jsonl:2: {why}"):
        await OfflineBatchSource(path, batch_size=5).next_batch()


@pytest.mark.parametrize(
    ("ids", "why"),
    [
        ('["abcd"]', r"input_ids\[0\] = 'abcd' is not an int token id"),
        ("[3, -1]", r"input_ids\[1\] = -1 is out of range \(token ids must be >= 0\)"),
        ("[1e30]", r"input_ids\[0\] = 1e\+30 is not an int token id"),
        ("[5.5]", r"input_ids\[0\] = 5.5 is not an int token id"),
        ("[true]", r"input_ids\[0\] = True is not an int token id"),
    ],
)
async def test_bad_token_ids_name_file_line_and_id(tmp_path, ids, why):
    path = tmp_path / "items.jsonl"
    n = ids.count(",") + 1
    path.write_text(f'{{"input_ids": {ids}, "action_mask": {[1] * n}}}\n')
    with pytest.raises(ValueError, match=rf"items.jsonl:1: bad SAW item record: {why}"):
        await OfflineBatchSource(path, batch_size=5).next_batch()


async def test_token_ids_at_or_past_the_vocab_size_are_refused(tmp_path):
    path = tmp_path / "items.jsonl"
    path.write_text(
        '{"input_ids": [0, 9], "action_mask": [0, 1]}\n{"input_ids": [0, 10], "action_mask": [0, 1]}\n'
    )
    source = OfflineBatchSource(path, batch_size=1, vocab_size=10)
    assert (await source.next_batch()).items[0].input_ids == [0, 9]
    with pytest.raises(ValueError, match=r"items.jsonl:2: .*input_ids\[1\] = 10 is out of range .*\[0, 10\)"):
        await source.next_batch()


async def test_bad_token_ids_in_a_rollout_trace_name_file_and_line(tmp_path):
    trace = {"prompt_token_ids": [5], "completion_token_ids": [6, "x"]}
    step = {"index": 0, "prev_obs": "o", "action": "a", "next_obs": None, "reward": 1.0,
            "truncated": False, "terminated": True, "trace": trace}  # fmt: skip
    path = tmp_path / "rollouts.jsonl"
    write_jsonl(path, [{"kind": "rollout", "id": "r", "steps": [step]}])
    with pytest.raises(ValueError, match=r"rollouts.jsonl:1: bad rollout record: completion_token_ids\[1\]"):
        await OfflineBatchSource(path, batch_size=5).next_batch()


def test_in_memory_items_are_checked_against_the_vocab_size():
    with pytest.raises(ValueError, match=r"items\[1\].input_ids\[2\] = 3 is out of range"):
        OfflineBatchSource([_item(0), _item(1)], batch_size=1, vocab_size=3)


async def test_fewer_items_than_a_batch_give_each_item_once_a_batch():
    source = OfflineBatchSource([_item(i) for i in range(3)], batch_size=5)
    batches = [[it.input_ids[0] for it in (await source.next_batch()).items] for _ in range(4)]
    assert batches == [[0, 1, 2]] * 4  # cycled, the file's rows went into one batch twice


async def test_an_item_a_reshuffled_epoch_brings_back_opens_the_next_batch():
    """Seed 3 orders 4 items [3, 0, 2, 1], then [0, 1, 3, 2]: the second batch (1, then the next epoch's 0)
    would have taken 1 again; it ends there and 1 opens the third."""
    source = OfflineBatchSource([_item(i) for i in range(4)], batch_size=3, shuffle=True, seed=3)
    batches = [[it.input_ids[0] for it in (await source.next_batch()).items] for _ in range(3)]
    assert batches == [[3, 0, 2], [1, 0], [1, 3, 2]]


@settings(max_examples=60, deadline=None)
@given(
    rows=st.integers(1, 9),
    batch_size=st.integers(1, 12),
    shuffle=st.booleans(),
    buffer=st.integers(1, 6),
    seed=st.integers(0, 50),
    epochs=st.one_of(st.none(), st.integers(1, 4)),
)
def test_batches_never_repeat_an_item_and_lose_none(rows, batch_size, shuffle, buffer, seed, epochs):
    """Batches, read one after another, give exactly the epochs' stream (what batch_size=1 gives), each item once
    an epoch, and no batch holds an item twice; a batch is short only at the data's end or at a repeat."""

    def batches_of(size: int, count: int) -> list[list[int]]:
        source = OfflineBatchSource(
            [_item(i) for i in range(rows)], batch_size=size, shuffle=shuffle, shuffle_buffer=buffer,
            seed=seed, epochs=epochs,
        )  # fmt: skip
        out = []
        for _ in range(count):
            try:
                out.append([it.input_ids[0] for it in asyncio.run(source.next_batch()).items])
            except StopAsyncIteration:
                break
        return out

    total = rows * (epochs or 3)
    stream = [b[0] for b in batches_of(1, total)]
    batches = batches_of(batch_size, total)
    flat = [i for b in batches for i in b][:total]
    assert flat == stream
    for epoch in range(total // rows):
        assert sorted(stream[epoch * rows : (epoch + 1) * rows]) == list(range(rows))
    for i, b in enumerate(batches):
        assert len(set(b)) == len(b)
        nxt = batches[i + 1][0] if i + 1 < len(batches) else None
        assert len(b) == batch_size or nxt is None or nxt in b
