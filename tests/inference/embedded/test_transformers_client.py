"""The embedded engine: exact token-in/token-out, batching, seeded sampling, atomic weight swaps."""

import asyncio
import copy

import pytest
import torch

from ludic.inference import ChatCompletionRequest, SamplingConfig, TransformersChatClient
from ludic.testing import tiny_model_path


@pytest.fixture(scope="module")
def client() -> TransformersChatClient:
    return TransformersChatClient(tiny_model_path())


def _req(content: str = "hello", **sampling) -> ChatCompletionRequest:
    return ChatCompletionRequest(
        model="tiny", messages=[{"role": "user", "content": content}], sampling=SamplingConfig(**sampling)
    )


def _forward_logps(model: torch.nn.Module, prompt: list[int], completion: list[int]) -> list[float]:
    """Fresh full-sequence forward: log-softmax of the raw logits at each completion token."""
    ids = torch.tensor([prompt + completion])
    with torch.no_grad():
        logps = torch.log_softmax(model(ids).logits.float(), dim=-1)
    return [float(logps[0, len(prompt) - 1 + i, tok]) for i, tok in enumerate(completion)]


async def test_returned_ids_and_logprobs_are_exactly_what_was_sampled(client):
    response, info = await client.complete(_req(max_tokens=12, seed=7))
    assert response.prompt_token_ids == client.prompt_ids_for(_req())
    assert len(response.completion_token_ids) == len(response.completion_logprobs) >= 1
    recomputed = _forward_logps(client.model, response.prompt_token_ids, response.completion_token_ids)
    assert recomputed == pytest.approx(response.completion_logprobs, abs=1e-4)
    assert info["policy_version"] == response.policy_version == client.policy_version


async def test_token_in_request_samples_from_the_given_ids(client):
    prompt = client.tokenizer.encode("abc", add_special_tokens=False)
    request = ChatCompletionRequest(
        model="tiny",
        messages=[{"role": "user", "content": "ignored"}],
        sampling=SamplingConfig(max_tokens=4, seed=1),
        prompt_token_ids=prompt,
    )
    response, _ = await client.complete(request)
    assert response.prompt_token_ids == prompt


async def test_greedy_is_deterministic(client):
    a, _ = await client.complete(_req(temperature=0.0, max_tokens=6))
    b, _ = await client.complete(_req(temperature=0.0, max_tokens=6))
    assert a.completion_token_ids == b.completion_token_ids


async def test_max_tokens_gives_length_and_eos_gives_stop(client):
    eos = client.tokenizer.eos_token_id
    responses = await asyncio.gather(*[client.complete(_req("m", max_tokens=3, seed=s)) for s in range(8)])
    for response, _ in responses:
        ids = response.completion_token_ids
        if ids[-1] == eos:
            assert response.finish_reason == "stop" and "<|im_end|>" not in response.text
        else:
            assert response.finish_reason == "length" and len(ids) == 3


async def test_eos_is_in_the_ids_but_not_in_the_text():
    # embeddings all ones (EOS row twos) and zeroed residual branches: the hidden state stays all
    # ones, so the tied lm_head scores EOS 256 and every other token 128 at every step
    fresh = TransformersChatClient(tiny_model_path())
    eos = fresh.tokenizer.eos_token_id
    state = fresh.model.state_dict()
    embed = torch.ones_like(state["model.embed_tokens.weight"])
    embed[eos] = 2.0
    update = {"model.embed_tokens.weight": embed}
    update.update(
        {
            k: torch.zeros_like(v)
            for k, v in state.items()
            if k.endswith(("o_proj.weight", "down_proj.weight"))
        }
    )
    fresh.sync_weights(update)
    response, _ = await fresh.complete(_req(temperature=0.0, max_tokens=5))
    assert response.completion_token_ids == [eos]
    assert response.finish_reason == "stop" and response.text == ""


async def test_seeded_sampling_is_reproducible_and_independent_of_the_batch(client):
    alone, _ = await client.complete(_req("x", max_tokens=16, seed=11))
    batch = await asyncio.gather(*[client.complete(_req(f"p{i}", max_tokens=16, seed=i)) for i in range(6)])
    mixed = await asyncio.gather(
        client.complete(_req("x", max_tokens=16, seed=11)),
        *[client.complete(_req(f"o{i}", max_tokens=9, seed=i)) for i in range(5)],
    )
    in_batch = mixed[0][0]
    assert len(batch) == 6
    assert in_batch.completion_token_ids == alone.completion_token_ids
    other, _ = await client.complete(_req("x", max_tokens=16, seed=12))
    assert other.completion_token_ids != alone.completion_token_ids


async def test_concurrent_requests_share_forward_passes(client):
    before = client.forward_calls
    responses = await asyncio.gather(
        *[client.complete(_req(f"q{i}", max_tokens=8, seed=i)) for i in range(16)]
    )
    used = client.forward_calls - before
    longest = max(len(r.completion_token_ids) for r, _ in responses)
    assert used == longest  # one prefill + one forward per later decoding step, for all 16 rows
    assert used < sum(len(r.completion_token_ids) for r, _ in responses)


async def test_a_group_of_identical_prompts_is_prefilled_once_and_samples_as_if_alone(client):
    rows_per_prefill: list[int] = []
    hook = client.model.register_forward_pre_hook(
        lambda _m, _a, kw: (
            rows_per_prefill.append(kw["input_ids"].shape[0]) if kw["input_ids"].shape[1] > 1 else None
        ),
        with_kwargs=True,
    )
    try:
        group = await asyncio.gather(
            *[client.complete(_req(p, max_tokens=12, seed=s)) for p in ("aa", "bbb") for s in range(4)]
        )
    finally:
        hook.remove()
    assert rows_per_prefill == [2]  # 8 rows, 2 distinct prompts: one prefill row per prompt
    alone, _ = await client.complete(_req("bbb", max_tokens=12, seed=2))
    assert group[6][0].completion_token_ids == alone.completion_token_ids
    assert group[6][0].completion_logprobs == pytest.approx(alone.completion_logprobs, abs=1e-5)
    for response, _ in group:  # every fanned-out row samples from its exact prompt's distribution
        recomputed = _forward_logps(client.model, response.prompt_token_ids, response.completion_token_ids)
        assert recomputed == pytest.approx(response.completion_logprobs, abs=1e-4)


async def test_stop_string_ends_the_completion_and_is_cut_from_text(client):
    # find what greedy decoding produces, then stop on a piece of it
    full, _ = await client.complete(_req("stop test", temperature=0.0, max_tokens=10))
    if len(full.text) < 3:
        pytest.fail(f"greedy completion too short to pick a stop string: {full.text!r}")
    stop = full.text[1:3]
    cut, _ = await client.complete(_req("stop test", temperature=0.0, max_tokens=10, stop=[stop]))
    assert cut.finish_reason == "stop"
    assert cut.text == full.text[: full.text.find(stop)]
    assert len(cut.completion_token_ids) <= len(full.completion_token_ids)


async def test_sync_weights_swaps_weights_and_bumps_version():
    client = TransformersChatClient(tiny_model_path())
    before, _ = await client.complete(_req(temperature=0.0, max_tokens=8))
    new = {k: v + 0.5 * torch.randn_like(v) for k, v in client.model.state_dict().items() if "mlp" in k}
    status = client.sync_weights(new, version=5)
    assert "policy_version=5" in status and await client.get_policy_version() == 5
    after, _ = await client.complete(_req(temperature=0.0, max_tokens=8))
    assert after.policy_version == 5
    assert after.completion_logprobs != before.completion_logprobs


@pytest.mark.parametrize(
    ("bad", "error", "match"),
    [
        ({"model.not_a_layer.weight": torch.zeros(2)}, KeyError, "unknown parameter names"),
        (
            {"model.norm.weight": torch.zeros(7)},
            ValueError,
            r"'model.norm.weight' has shape \(7,\), expected \(128,\)",
        ),
        ({"model.norm.weight": torch.full((128,), float("nan"))}, ValueError, "NaN or inf"),
        ({"model.norm.weight": torch.ones(128, dtype=torch.long)}, TypeError, "dtype torch.int64"),
    ],
)
async def test_bad_state_dict_is_rejected_and_old_weights_keep_serving(bad, error, match):
    client = TransformersChatClient(tiny_model_path())
    before, _ = await client.complete(_req(temperature=0.0, max_tokens=8))
    good_part = {"model.layers.0.mlp.up_proj.weight": torch.zeros(384, 128)}
    with pytest.raises(error, match=match):
        client.sync_weights({**good_part, **bad})
    after, _ = await client.complete(_req(temperature=0.0, max_tokens=8))
    assert after.completion_token_ids == before.completion_token_ids  # log-probs to fp32 rounding: the thread
    assert after.completion_logprobs == pytest.approx(before.completion_logprobs, abs=3e-6)  # count follows load
    assert client.policy_version == 0


async def test_bad_requests_raise_clear_errors(client):
    with pytest.raises(ValueError, match="max_position_embeddings"):
        await client.complete(_req(max_tokens=5000))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        await client.complete(
            ChatCompletionRequest(
                model="t", messages=[{"role": "user", "content": "x"}], prompt_token_ids=[10**6]
            )
        )


@pytest.mark.parametrize(
    ("build", "match"),
    [
        (lambda: SamplingConfig(temperature=-1.0), "temperature must be a finite number >= 0"),
        (lambda: SamplingConfig(top_p=0.0), r"top_p must be in \(0, 1\]"),
        (lambda: SamplingConfig(max_tokens=0), "max_tokens must be an int >= 1"),
        (lambda: _req(stop=[""]), "stop must be non-empty strings"),
        (
            lambda: ChatCompletionRequest(model="t", messages=[{"role": "user"}]),
            r"messages\[0\]\['content'\] must be a str",
        ),
        (
            lambda: ChatCompletionRequest(model="t", messages=[{"content": "x"}]),
            r"messages\[0\]\['role'\] must be one of",
        ),
    ],
)
def test_bad_sampling_values_and_malformed_messages_raise_clear_errors(build, match):
    with pytest.raises((ValueError, TypeError), match=match):
        build()


async def test_sync_during_generation_waits_for_the_batch_and_later_requests_see_new_weights():
    client = TransformersChatClient(tiny_model_path())
    old_model = copy.deepcopy(client.model)
    new = {k: v + 0.5 * torch.randn_like(v) for k, v in client.model.state_dict().items() if "mlp" in k}
    first = asyncio.gather(*[client.complete(_req(f"a{i}", max_tokens=48, seed=i)) for i in range(8)])
    before = client.forward_calls
    while client.forward_calls == before:  # wait until the first batch is mid-generation
        await asyncio.sleep(0.001)
    await asyncio.to_thread(client.sync_weights, new)
    second, _ = await client.complete(_req("b", max_tokens=8, seed=1))
    for response, _ in await first:  # the whole first batch came from the old weights
        assert response.policy_version == 0
        old_logps = _forward_logps(old_model, response.prompt_token_ids, response.completion_token_ids)
        assert old_logps == pytest.approx(response.completion_logprobs, abs=1e-4)
    assert second.policy_version == 1
    new_logps = _forward_logps(client.model, second.prompt_token_ids, second.completion_token_ids)
    assert new_logps == pytest.approx(second.completion_logprobs, abs=1e-4)


async def test_tokenizer_without_chat_template_is_a_clear_error():
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path())
    tokenizer.chat_template = None
    client = TransformersChatClient(tiny_model_path(), tokenizer)
    with pytest.raises(ValueError, match="has no chat_template"):
        await client.complete(_req())


async def test_generate_in_thread_false_decodes_on_the_loop_thread_with_the_same_results():
    import threading

    inline = TransformersChatClient(tiny_model_path(), generate_in_thread=False)
    threaded = TransformersChatClient(tiny_model_path())
    threads: set[int] = set()
    hook = inline.model.register_forward_pre_hook(lambda *_: threads.add(threading.get_ident()))
    try:
        got = await asyncio.gather(*[inline.complete(_req(f"t{i}", max_tokens=8, seed=i)) for i in range(4)])
    finally:
        hook.remove()
    want = await asyncio.gather(*[threaded.complete(_req(f"t{i}", max_tokens=8, seed=i)) for i in range(4)])
    assert threads == {threading.get_ident()}
    assert [r.completion_token_ids for r, _ in got] == [r.completion_token_ids for r, _ in want]


async def test_decoding_thread_is_chosen_by_device_unless_set() -> None:
    import threading

    on_cpu = TransformersChatClient(tiny_model_path())
    assert on_cpu.generate_in_thread is False  # a CPU box: one OpenMP team shared with the trainer
    assert TransformersChatClient(tiny_model_path(), generate_in_thread=True).generate_in_thread is True
    seen: list[str] = []
    original = on_cpu._decode_region

    def spy(region, deliver):
        seen.append(threading.current_thread().name)
        return original(region, deliver)

    on_cpu._decode_region = spy  # type: ignore[method-assign]
    await on_cpu.complete(_req(max_tokens=2))
    assert seen == [threading.current_thread().name]  # decoded on the event loop's own thread


async def test_prefill_computes_only_each_prompts_last_logits():
    """The prefill's output layer sees one position per distinct prompt, not every prompt position: the full
    ``[prompts, width, vocab]`` logits are 0.9 GB for 64 prompts of 70 tokens at SmolLM2's vocabulary."""
    engine = TransformersChatClient(tiny_model_path())
    seen: list[tuple[int, ...]] = []
    handle = engine.model.lm_head.register_forward_hook(lambda mod, inp, out: seen.append(tuple(inp[0].shape)))
    try:
        prompts = ["a much longer first prompt", "b"]
        results = await asyncio.gather(*(engine.complete(_req(p, temperature=0.0, max_tokens=3)) for p in prompts))
    finally:
        handle.remove()
    hidden = engine.model.config.hidden_size
    assert seen[0] == (2, 1, hidden)  # the prefill: both prompts, their last position only
    for (response, _), prompt in zip(results, prompts, strict=True):  # greedy tokens still the full forward's
        ids = torch.tensor([response.prompt_token_ids])
        with torch.no_grad():
            first = int(engine.model(ids).logits[0, -1].argmax())
        assert response.completion_token_ids[0] == first, prompt
