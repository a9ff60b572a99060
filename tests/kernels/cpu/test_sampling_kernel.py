"""The engine's vectorised sampler draws from the right distribution, with and without a nucleus."""

from __future__ import annotations

import pytest
import torch

from ludic.kernels.cpu.sampling_kernel import sample_tokens

LOGITS = torch.tensor([2.0, 1.0, 0.0, -1.0, 0.5])


def frequencies(temperature: float, top_p: float, n: int = 40_000) -> torch.Tensor:
    gen = torch.Generator().manual_seed(0)
    logits = LOGITS.expand(n, -1)
    params = torch.tensor([[temperature, top_p]]).expand(n, -1)
    picks = sample_tokens(logits, params, torch.rand(n, generator=gen))
    return torch.bincount(picks, minlength=len(LOGITS)).float() / n


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_full_distribution_matches_the_softmax(temperature):
    expected = torch.softmax(LOGITS / temperature, dim=-1)
    torch.testing.assert_close(frequencies(temperature, 1.0), expected, atol=0.01, rtol=0)


def test_nucleus_keeps_the_smallest_prefix_reaching_top_p_and_renormalises():
    probs = torch.softmax(LOGITS, dim=-1)  # sorted order: 0, 1, 4, 2, 3
    top_p = float(probs[0] + probs[1]) - 1e-3  # tokens 0 and 1 reach it
    kept = probs[[0, 1]] / probs[[0, 1]].sum()
    freq = frequencies(1.0, top_p)
    torch.testing.assert_close(freq[[0, 1]], kept, atol=0.01, rtol=0)
    assert freq[[2, 3, 4]].sum() == 0


def test_temperature_zero_is_greedy_in_a_mixed_batch():
    logits = torch.stack([LOGITS, LOGITS.flip(0)])
    params = torch.tensor([[0.0, 1.0], [0.0, 0.5]])
    picks = sample_tokens(logits, params, torch.tensor([0.99, 0.99]))
    assert picks.tolist() == [0, len(LOGITS) - 1]


def reference_draw(logits: torch.Tensor, temperature: float, top_p: float, u: float) -> tuple[int, float]:
    """One row drawn the plain way, from the definition: softmax(logits / T); with a nucleus, the
    smallest prefix of the probabilities sorted high to low whose mass reaches top_p, renormalised;
    the token where the cumulative mass first reaches u (vocabulary order without a nucleus)."""
    if temperature == 0:
        token = int(logits.argmax())
        return token, float(torch.log_softmax(logits, -1)[token])
    probs = torch.softmax(logits / temperature, -1).double()
    order = torch.argsort(probs, descending=True, stable=True) if top_p < 1 else torch.arange(len(probs))
    kept, mass = [], 0.0
    for i in order.tolist():
        if top_p < 1 and mass > top_p:
            break
        kept.append(i)
        mass += float(probs[i])
    running = 0.0
    for i in kept:
        running += float(probs[i])
        if running >= u * mass:
            return i, float(torch.log(probs[i] / mass))
    return kept[-1], float(torch.log(probs[kept[-1]] / mass))


def test_tokens_and_logprobs_equal_the_plain_reference_row_by_row():
    from ludic.kernels.cpu.sampling_kernel import sample_with_logprobs

    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(64, 11, generator=gen) * 2
    settings = [(1.0, 1.0), (0.7, 1.0), (1.0, 0.6), (1.3, 0.9), (0.0, 1.0), (0.0, 0.5)]
    params = torch.tensor([settings[i % len(settings)] for i in range(64)])
    uniforms = torch.rand(64, generator=gen)
    tokens, logps = sample_with_logprobs(logits, params, uniforms)
    for row in range(64):
        (temperature, top_p), u = settings[row % len(settings)], float(uniforms[row])
        token, logp = reference_draw(logits[row], temperature, top_p, u)
        assert int(tokens[row]) == token, row
        assert float(logps[row]) == pytest.approx(logp, abs=1e-5), row


def test_a_rows_draw_does_not_depend_on_the_other_rows_of_the_batch():
    """A row without a nucleus drew in sorted order when another row of the batch had one, and in
    vocabulary order otherwise: a seeded request's tokens changed with its batch-mates."""
    from ludic.kernels.cpu.sampling_kernel import sample_with_logprobs

    logits = torch.tensor([[0.1, 2.0, 0.3, 1.5, -1.0]] * 2)
    u = torch.tensor([0.65, 0.65])  # vocabulary order: token 2; sorted order: token 3
    alone, _ = sample_with_logprobs(logits[:1], torch.tensor([[1.0, 1.0]]), u[:1])
    mixed, _ = sample_with_logprobs(logits, torch.tensor([[1.0, 1.0], [1.0, 0.5]]), u)
    assert int(mixed[0]) == int(alone[0])


def test_the_temperature_one_and_no_greedy_shortcuts_draw_bit_for_bit_as_the_full_path():
    """A batch all at temperature 1 skips the division and, with no greedy row, the argmax pass: its
    rows get the same tokens and the same log-prob bits as in a batch that runs both passes."""
    from ludic.kernels.cpu.sampling_kernel import sample_with_logprobs

    gen = torch.Generator().manual_seed(5)
    logits = torch.randn(32, 1000, generator=gen) * 3
    uniforms = torch.rand(32, generator=gen)
    short_tokens, short_logps = sample_with_logprobs(logits, torch.tensor([[1.0, 1.0]]).expand(32, -1), uniforms)
    extra = torch.randn(2, 1000, generator=gen)  # a greedy row and a tempered row force both passes
    full_params = torch.tensor([[1.0, 1.0]] * 32 + [[0.0, 1.0], [0.7, 1.0]])
    full_tokens, full_logps = sample_with_logprobs(torch.cat([logits, extra]), full_params, torch.cat([uniforms, uniforms[:2]]))
    assert torch.equal(short_tokens, full_tokens[:32])
    assert torch.equal(short_logps, full_logps[:32])
    assert int(full_tokens[32]) == int(extra[0].argmax())
    for row in range(0, 32, 7):
        token, logp = reference_draw(logits[row], 1.0, 1.0, float(uniforms[row]))
        assert int(short_tokens[row]) == token
        assert float(short_logps[row]) == pytest.approx(logp, abs=1e-5)


SETTINGS = [(1.0, 1.0), (0.7, 1.0), (1.0, 0.6), (0.0, 1.0), (1.3, 0.9), (1.0, 1.0)]


def test_a_plan_made_on_the_host_draws_as_the_plan_read_from_the_params():
    from ludic.kernels.cpu.sampling_kernel import SamplingPlan, sample_with_logprobs

    gen = torch.Generator().manual_seed(7)
    logits = torch.randn(48, 500, generator=gen) * 3
    settings = [SETTINGS[i % len(SETTINGS)] for i in range(48)]
    params, uniforms = torch.tensor(settings), torch.rand(48, generator=gen)
    plan = SamplingPlan.of(settings)
    assert plan == SamplingPlan.of_params(params) == SamplingPlan(divide=True, any_greedy=True, nucleus=True)
    assert SamplingPlan.of([(1.0, 1.0), (0.0, 1.0)]) == SamplingPlan(divide=False, any_greedy=True, nucleus=False)
    # read as the fp32 params are: 1e-50 is 0 there (greedy), 1 - 1e-12 is 1 (no nucleus)
    assert SamplingPlan.of([(1e-50, 1 - 1e-12)]) == SamplingPlan(divide=False, any_greedy=True, nucleus=False)
    with_plan = sample_with_logprobs(logits, params, uniforms, plan)
    without = sample_with_logprobs(logits, params, uniforms)
    assert torch.equal(with_plan[0], without[0]) and torch.equal(with_plan[1], without[1])


@pytest.mark.parametrize("kept", [(1.0, 1.0), (0.7, 1.0), (0.0, 1.0), (1.3, 0.9)])
def test_a_batchs_plan_holds_for_the_rows_left_when_the_others_finish(kept):
    """The engine makes the plan once per batch; as rows finish, the live ones may need fewer passes
    than the plan runs. Their tokens stay those of a plan made for them alone, their log-probs to rounding."""
    from ludic.kernels.cpu.sampling_kernel import SamplingPlan, sample_with_logprobs

    gen = torch.Generator().manual_seed(11)
    logits = torch.randn(16, 2000, generator=gen) * 2
    uniforms = torch.rand(16, generator=gen)
    batch_plan = SamplingPlan.of(SETTINGS)
    live = torch.tensor([kept]).expand(16, -1)
    tokens, logps = sample_with_logprobs(logits, live, uniforms, batch_plan)
    own_tokens, own_logps = sample_with_logprobs(logits, live, uniforms, SamplingPlan.of([kept]))
    assert torch.equal(tokens, own_tokens)
    torch.testing.assert_close(logps, own_logps, rtol=0, atol=1e-6)
    if kept[0] == 0.0:
        assert torch.equal(tokens, logits.argmax(-1))


def test_with_a_plan_the_draw_reads_nothing_back_from_the_params(monkeypatch):
    """On a GPU, reading a tensor's truth value waits for the device: the decoding loop passes the plan
    it made on the host, so a step's draw never does."""
    from ludic.kernels.cpu.sampling_kernel import SamplingPlan, sample_with_logprobs

    logits = torch.randn(6, 50, generator=torch.Generator().manual_seed(2))
    params, uniforms = torch.tensor(SETTINGS), torch.full((6,), 0.4)
    expected = sample_with_logprobs(logits, params, uniforms)
    plan = SamplingPlan.of(SETTINGS)  # on the host, from the requests' settings

    def no_reads(self):
        raise AssertionError("a tensor's truth value was read")

    monkeypatch.setattr(torch.Tensor, "__bool__", no_reads)
    got = sample_with_logprobs(logits, params, uniforms, plan)
    with pytest.raises(AssertionError, match="truth value"):
        sample_with_logprobs(logits, params, uniforms)  # without a plan it reads them
    monkeypatch.undo()
    assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])


def _definition_pick(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """The inverse CDF in float64, one cumsum over the vocabulary: what the two-level search stands for."""
    cdf = probs.double().cumsum(-1)
    return torch.searchsorted(cdf, (uniforms.double() * cdf[:, -1]).unsqueeze(-1)).squeeze(-1)


@pytest.mark.parametrize("vocab", [4096, 3000])  # a whole number of blocks, and a padded last block
def test_the_two_level_search_draws_the_definitions_token_away_from_token_boundaries(vocab):
    """The block sums and the in-block cumsum add in another order than one cumsum: a draw may differ from
    the float64 definition only where its target lies within fp32 rounding of the drawn token's edge."""
    from ludic.kernels.cpu.sampling_kernel import PICK_BLOCK, _vocab_order_pick

    assert vocab >= 4 * PICK_BLOCK  # the two-level path, not the small-vocabulary cumsum
    gen = torch.Generator().manual_seed(13)
    logits = torch.randn(512, vocab, generator=gen) * 3
    probs = torch.softmax(logits, -1)
    uniforms = torch.rand(512, generator=gen)
    got, want = _vocab_order_pick(probs, uniforms), _definition_pick(probs, uniforms)
    cdf = probs.double().cumsum(-1)
    target = uniforms.double() * cdf[:, -1]
    for row in torch.nonzero(got != want).flatten().tolist():
        edge = min(abs(float(cdf[row, got[row]] - target[row])), abs(float(cdf[row, got[row] - 1] - target[row])))
        assert edge < 1e-5, (row, int(got[row]), int(want[row]))
    assert int((got == want).sum()) >= 505


def test_the_two_level_search_never_draws_a_token_without_mass():
    """Whole blocks without mass, blocks whose tail has none, and targets on a block's exact end: the
    drawn token always has probability above 0 (a rounding overshoot falls back on the block's last
    token with mass)."""
    from ludic.kernels.cpu.sampling_kernel import PICK_BLOCK, sample_with_logprobs

    vocab = 20 * PICK_BLOCK + 5
    logits = torch.full((1, vocab), float("-inf"))
    alive = [3, PICK_BLOCK - 7, 5 * PICK_BLOCK + 1, 5 * PICK_BLOCK + 2, 11 * PICK_BLOCK - 1, vocab - 2]
    logits[0, alive] = torch.tensor([0.5, -2.0, 1.0, 30.0, -1.0, 0.0])
    probs = torch.softmax(logits, -1)
    ends = probs.view(-1)[: 20 * PICK_BLOCK].view(20, PICK_BLOCK).sum(-1).cumsum(0)
    uniforms = torch.cat([torch.linspace(0, 1, 4001)[1:-1], ends / ends[-1], torch.tensor([1 - 2**-24])])
    n = uniforms.numel()
    tokens, logps = sample_with_logprobs(logits.expand(n, -1), torch.tensor([[1.0, 1.0]]).expand(n, -1), uniforms)
    assert set(tokens.tolist()) <= set(alive)
    assert torch.isfinite(logps).all()
    torch.testing.assert_close(logps, torch.log_softmax(logits, -1)[0, tokens], rtol=0, atol=1e-6)


def test_a_target_past_the_blocks_cumsum_by_rounding_draws_the_blocks_last_token_with_mass():
    """A block of one large and many tiny probabilities: its sum keeps the tiny ones (added apart), one
    running cumsum loses them (1 + 1e-8 == 1 in fp32). A target between the two lies inside the block by
    the block sums and past its end by the cumsum: the draw stays in the block, on a token with mass, not
    on the next block's first token (which has none here)."""
    from ludic.kernels.cpu.sampling_kernel import PICK_BLOCK, _vocab_order_pick

    probs = torch.zeros(1, 5 * PICK_BLOCK)
    probs[0, 0], probs[0, 1 : PICK_BLOCK - 1] = 1.0, 1e-8  # the block's last token has no mass
    probs[0, PICK_BLOCK + 1] = 1.0  # the next block's first token has none either
    block_sum = float(probs[0, :PICK_BLOCK].sum())
    running_end = float(probs[0, :PICK_BLOCK].cumsum(-1)[-1])
    assert running_end < block_sum  # the rounding this test is about, on this build
    total = float(probs.view(1, -1, PICK_BLOCK).sum(-1).sum(-1))  # the total the search scales u by
    target = (running_end + block_sum) / 2
    token = int(_vocab_order_pick(probs, torch.tensor([target / total]))[0])
    assert token == PICK_BLOCK - 2  # the block's last token with mass
