"""One batched, KV-cached decoding run for the embedded engine.

All rows share one forward per decoding step. Prompts are left-padded and each distinct prompt is
prefilled once; finished rows are dropped from the batch (and the KV cache) so they stop costing
compute. Llama-family models then decode through ``LeanDecoder`` on a preallocated cache (the
model's forward's logits, to fp32 rounding with oneDNN's matmuls on the CPU or bit for bit with
``exact=True``, without its per-step overheads: ``bench/bench_engine_profile.py``); on the CPU,
rows that share a prompt read its K/V once per step (``SharedPrefixKVCache``); others decode
through the model's forward. Each row draws its uniforms from its own ``torch.Generator``
once per batch, so a seeded request gives the same completion whatever else is in the batch, on
either path.
"""

from __future__ import annotations

import inspect
import random
from collections.abc import Callable, Generator

import torch
from transformers.modeling_outputs import CausalLMOutputWithPast

from ludic.inference.embedded._rows import RowRequest, RowResult, emit_step
from ludic.inference.embedded._stop_strings import StopMatcher
from ludic.inference.sampling import SamplingConfig
from ludic.kernels import CpuKernels, select
from ludic.kernels.cpu.lean_decoder import LeanDecoder, StaticKVCache, lean_unsupported
from ludic.kernels.cpu.sampling_kernel import SamplingPlan, sample_tokens, sample_with_logprobs
from ludic.kernels.cpu.shared_prefix_cache import SharedPrefixKVCache

# the KV cache's name in forward() and outputs: "cache" once transformers deprecated "past_key_values" (it warns)
CACHE = "cache" if "cache" in getattr(CausalLMOutputWithPast, "__dataclass_fields__", {}) else "past_key_values"

__all__ = ["BatchGenerator", "RowRequest", "RowResult", "Steps", "sample_tokens", "sample_with_logprobs"]
Steps = Generator[int, "bool | None", "list[RowResult]"]
"""A decoding run, step by step: yields the tokens generated so far before each decoding forward
(where a pause may hold, or other runs take their turn), returns the rows' results. Sending True at a
yield says the weights changed there: the live rows are prefilled again under the new weights."""


class BatchGenerator:
    """Runs the decoding loop for a list of rows against one model.

    Llama-family models decode through ``LeanDecoder`` on a preallocated KV cache; others (or
    ``lean=False``) through the model's own forward on a growing ``DynamicCache``. Both sample the
    same way from the same per-row uniforms, so a seeded row gives the same tokens on either path
    (barring a draw within fp32 rounding of a token boundary). ``exact=True``: the lean path's logits
    equal the model's forward bit for bit (its own matmuls, each row its own copy of the prompt's K/V).
    ``cpu_kernels``: the CPU kernels' switch (``ludic.kernels.select``); ``lean``/``share_prefix`` turn one off.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        tokenizer,
        eos_ids: set[int],
        pad_id: int,
        device: torch.device,
        *,
        lean: bool = True,
        share_prefix: bool = True,
        exact: bool = False,
        cpu_kernels: CpuKernels | None = None,
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids
        self.pad_id = pad_id
        self.device = device
        self.forward_calls = 0
        # the prefill needs each prompt's last logits only ([prompts, width, vocab]: 0.9 GB for 64 x 70 tokens at
        # SmolLM2's vocabulary; the main job's held-out eval peaked 0.2 GB lower without them)
        self.last_logits_only = "logits_to_keep" in inspect.signature(model.forward).parameters
        kernels, lean = select(device, cpu_kernels), lean and lean_unsupported(model) is None
        self.lean = LeanDecoder(
            model, exact=exact, packed=kernels.packed_linear, gemm=kernels.decode_gemm, layers=kernels.decode_layers
        ) if lean and kernels.lean_decoder else None  # fmt: skip
        self.share_prefix = share_prefix and not exact and kernels.shared_prefix_cache  # one K/V per prompt
        self.native_attention = kernels.decode_attention  # the shared-prefix cache's attention in one native call

    def _forward(self, cache: object = None, **kwargs) -> tuple[torch.Tensor, object]:
        """The model's forward, its KV cache passed and read back under this transformers' name (``CACHE``)."""
        self.forward_calls += 1
        if cache is not None:
            kwargs[CACHE] = cache
        out = self.model(use_cache=True, return_dict=True, **kwargs)
        return out.logits[:, -1, :], getattr(out, CACHE)

    def generate(
        self, rows: list[RowRequest], between_steps: Callable[[int], bool | None] | None = None
    ) -> list[RowResult]:
        """``between_steps(tokens generated so far)`` runs before each decoding forward (a pause may hold
        there); it returns True when the weights changed meanwhile."""
        run, signal = self.steps(rows), None
        while True:
            try:
                generated = run.send(signal)
            except StopIteration as done:
                return done.value
            signal = True if between_steps is not None and between_steps(generated) else None

    def bind(self, rows: int) -> list | None:
        """The lean path's weights for runs of about ``rows`` rows (None: runs use the model's forward)."""
        return self.lean.bind(rows) if self.lean is not None else None

    @torch.inference_mode()
    def steps(self, rows: list[RowRequest], weights: list | None = None) -> Steps:
        """``generate`` as a generator, so runs can interleave step by step (``_scheduler``).
        ``weights``: a one-item list holding ``bind()``'s result, shared by the runs of one weights-lock
        hold (and replaced there when the weights change); None binds this run's own.

        When True is sent at a yield (the weights changed), the live rows' K/V, computed by the old
        weights, are dropped: each row is prefilled again as prompt + its tokens so far, under the new
        weights, and decodes on with its remaining uniforms, so every later token is exactly the new
        model's (a mix of old K/V and new matmuls is neither model)."""
        uniforms, own = self._uniforms(rows), weights is None
        weights = [None] if weights is None else weights
        results = [RowResult() for _ in rows]
        live, done = list(range(len(rows))), 0
        while True:
            part_rows = [rows[i].continued(results[i].completion_ids) for i in live] if done else rows
            part = yield from self._run(part_rows, uniforms[live, done:], weights, done)
            for i, res in zip(live, part, strict=True):
                total = results[i]
                total.completion_ids += res.completion_ids
                total.logprobs += res.logprobs
                total.finish_reason, total.stop_text_end = res.finish_reason, res.stop_text_end
            live = [i for i in live if results[i].finish_reason is None]  # stopped by a weight change
            if not live:
                return results
            done = len(results[live[0]].completion_ids)  # rows of a run advance together
            if own:
                weights[0] = None

    def _run(self, rows: list[RowRequest], uniforms: torch.Tensor, weights: list, offset: int) -> Steps:
        """One prefill and the decoding after it; yields ``offset`` + the tokens generated, and returns
        early (live rows unfinished) when True is sent."""
        settings = torch.tensor([[r.sampling.temperature, r.sampling.top_p] for r in rows])
        params, plan = settings.to(self.device), SamplingPlan.of_params(settings)  # read on the host, not the device
        logits, cache, mask, positions, index = self._prefill(rows)
        steps = max(r.sampling.max_tokens for r in rows)
        if self.lean is not None and self.lean.fits(mask.shape[1] + steps):
            if weights[0] is None:
                weights[0] = self.lean.bind(len(rows))
            return (yield from self._decode_lean(rows, logits, cache, mask, positions, index, uniforms, (params, plan),
                                                 weights, offset))  # fmt: skip
        if index.numel() > cache.layers[0].keys.shape[0]:  # fan the distinct prompts' KV out to rows
            cache.batch_select_indices(index)
        return (yield from self._decode_hf(rows, logits, cache, mask, positions, uniforms, (params, plan), offset))

    def _uniforms(self, rows: list[RowRequest]) -> torch.Tensor:
        """[rows, longest max_tokens]: row i's draws come from its own generator (seeded or random)."""
        steps = max(r.sampling.max_tokens for r in rows)
        out = torch.zeros((len(rows), steps))
        for i, row in enumerate(rows):
            seed = row.sampling.seed if row.sampling.seed is not None else random.getrandbits(63)
            n = row.sampling.max_tokens
            out[i, :n] = torch.rand(n, generator=torch.Generator().manual_seed(seed))
        return out.to(self.device)

    def _decode_lean(self, rows, logits, dyn_cache, mask, positions, index, uniforms, sampling, weights, offset) -> Steps:
        """Decode on a preallocated cache; finished rows leave the batch (and the cache) at once.
        ``sampling``: the rows' ``[B, 2]`` (temperature, top_p) and their ``SamplingPlan``."""
        params, plan = sampling
        width, steps = mask.shape[1], uniforms.shape[1]
        cache = self._decode_cache(dyn_cache, index, mask, steps)
        del dyn_cache
        cos_table, sin_table = self.lean.rope_tables(width + steps, logits.dtype)
        alive = torch.arange(len(rows), device=self.device)  # original index of each live row
        alive_list = list(range(len(rows)))
        position = positions[:, -1] + 1
        limits = torch.tensor([r.sampling.max_tokens for r in rows], device=self.device)
        eos = torch.tensor(sorted(self.eos_ids), device=self.device, dtype=torch.long)
        stops = self._stop_matcher(rows)
        aborted: set[int] = set()  # rows dropped because their caller cancelled
        record: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []
        streaming = [r for r in rows if r.on_token is not None]
        for step in range(steps):
            tokens, logps = sample_with_logprobs(logits, params[alive], uniforms[alive, step], plan)
            record.append((alive, tokens, logps))
            if streaming:  # rows of a run advance together: each live row's token is at offset + step
                emit_step(rows, alive_list, tokens.tolist(), offset + step)
            done = torch.isin(tokens, eos) | (limits[alive] <= step + 1)
            cancelled = {b for b, i in enumerate(alive_list) if rows[i].is_cancelled()}
            aborted.update(alive_list[b] for b in cancelled)
            extra = self._stopped(stops, alive_list, tokens) | cancelled
            if extra:
                done[sorted(extra)] = True
            if bool(done.any()):
                order = cache.drop(done, width + step)
                if order is None:
                    break
                alive, tokens, position = alive[order], tokens[order], position[order]
                alive_list = alive.tolist()
            if (yield offset + step + 1):  # the weights changed: steps() prefills the live rows again
                break
            self.forward_calls += 1
            logits = self.lean.step(weights[0], tokens, cos_table[position], sin_table[position], cache, width + step)
            position = position + 1
        return self._results(rows, record, stops, aborted)

    def _stop_matcher(self, rows: list[RowRequest]) -> StopMatcher:
        """Stop strings over each row's whole completion: the tokens of a run before this one too."""
        stops = StopMatcher(self.tokenizer, self.eos_ids, [r.sampling.stop for r in rows])
        for i, row in enumerate(rows):
            for token in row.generated if stops else ():
                stops.add(i, token)
        return stops

    @staticmethod
    def _stopped(stops: StopMatcher, alive: list[int], tokens: torch.Tensor) -> set[int]:
        """Batch positions whose row's text now holds one of its stop strings."""
        if not stops:
            return set()
        return {b for b, (i, tok) in enumerate(zip(alive, tokens.tolist(), strict=True)) if stops.add(i, tok)}

    def _decode_cache(self, dyn_cache, index, mask, steps) -> StaticKVCache | SharedPrefixKVCache:
        """Rows sharing a prompt attend over one copy of its K/V (``SharedPrefixKVCache``, logits equal
        to fp32 rounding; CPU only); with every prompt distinct, on other devices, or with
        ``share_prefix=False`` or ``exact``, each row gets its own copy (``StaticKVCache``, with ``exact``
        the Hugging Face forward's logits bit for bit)."""
        keys = dyn_cache.layers[0].keys
        prompts = keys.shape[0]
        if not self.share_prefix or prompts == index.shape[0] or keys.device.type != "cpu":
            return StaticKVCache.from_prefill(dyn_cache, index, mask, mask.shape[1] + steps)
        prompt_mask = torch.zeros((prompts, mask.shape[1]), dtype=mask.dtype, device=mask.device)
        prompt_mask[index] = mask
        groups = self.lean.heads // self.lean.kv_heads
        return SharedPrefixKVCache(dyn_cache, index, prompt_mask, steps, native=self.native_attention, groups=groups)

    def _results(self, rows, record, stops: StopMatcher, aborted: set[int]) -> list[RowResult]:
        """Per-row token and log-prob lists from the per-step records, with finish reasons."""
        which = torch.cat([r[0] for r in record]).tolist()
        tokens = torch.cat([r[1] for r in record]).tolist()
        logps = torch.cat([r[2] for r in record]).float().tolist()
        results = [RowResult() for _ in rows]
        for i, tok, logp in zip(which, tokens, logps, strict=True):
            results[i].completion_ids.append(tok)
            results[i].logprobs.append(logp)
        for i, (row, res) in enumerate(zip(rows, results, strict=True)):
            if i in aborted:
                res.finish_reason = "abort"
            elif i in stops.cut:
                res.finish_reason, res.stop_text_end = "stop", stops.cut[i]
            elif res.completion_ids and res.completion_ids[-1] in self.eos_ids:
                res.finish_reason = "stop"
            elif len(res.completion_ids) >= row.sampling.max_tokens:
                res.finish_reason = "length"
        return results

    def _decode_hf(self, rows, logits, cache, mask, positions, uniforms, sampling, offset) -> Steps:
        """Decode through the model's own forward (architectures ``LeanDecoder`` does not cover)."""
        params, plan = sampling
        results = [RowResult() for _ in rows]
        stops = self._stop_matcher(rows)
        alive = list(range(len(rows)))  # original row index of each batch row
        next_pos = positions[:, -1:] + 1
        step = 0
        while alive:
            sampled, logps = sample_with_logprobs(logits, params[alive], uniforms[alive, step], plan)
            step += 1
            tokens, keep = [], []
            for b, (i, tok, logp) in enumerate(zip(alive, sampled.tolist(), logps.tolist(), strict=True)):
                res = results[i]
                res.completion_ids.append(tok)
                res.logprobs.append(logp)
                if rows[i].is_cancelled():
                    res.finish_reason = "abort"
                    continue
                rows[i].emit(offset + step - 1, tok)
                if self._finished(res, rows[i].sampling, tok, stops.add(i, tok), stops.cut.get(i)):
                    continue
                tokens.append(tok)
                keep.append(b)
            if not keep:
                break
            if len(keep) < len(alive):
                index = torch.tensor(keep, device=self.device)
                cache.batch_select_indices(index)
                mask, next_pos = mask[index], next_pos[index]
                alive = [alive[b] for b in keep]
            if (yield offset + step):
                break
            step_ids = torch.tensor(tokens, device=self.device).unsqueeze(-1)
            mask = torch.cat([mask, torch.ones_like(step_ids)], dim=-1)
            logits, cache = self._forward(
                input_ids=step_ids, attention_mask=mask, position_ids=next_pos, cache=cache
            )
            next_pos = next_pos + 1
        return results

    def _prefill(self, rows: list[RowRequest]):
        """Left-padded prefill of each *distinct* prompt once: (logits, cache, mask, positions, index).

        A GRPO group sends its prompt G times; like a prefix cache, the KV of one copy serves all:
        ``index`` maps each row to its prompt's cache row; logits, mask and positions are per row.
        """
        unique: dict[tuple[int, ...], int] = {}
        row_to_unique = [unique.setdefault(tuple(r.prompt_ids + r.generated), len(unique)) for r in rows]
        prompts = list(unique)
        width = max(map(len, prompts))
        input_ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, prompt in enumerate(prompts):
            input_ids[i, width - len(prompt) :] = torch.tensor(prompt)
            mask[i, width - len(prompt) :] = 1
        input_ids, mask = input_ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        keep = {"logits_to_keep": 1} if self.last_logits_only else {}
        logits, cache = self._forward(input_ids=input_ids, attention_mask=mask, position_ids=positions, **keep)
        index = torch.tensor(row_to_unique, device=self.device)
        return logits[index], cache, mask[index], positions[index], index

    def _finished(self, res: RowResult, sampling: SamplingConfig, tok: int, stopped: bool, cut: int | None) -> bool:
        if tok in self.eos_ids:
            res.finish_reason = "stop"
            return True
        if stopped:
            res.finish_reason, res.stop_text_end = "stop", cut
            return True
        if len(res.completion_ids) >= sampling.max_tokens:
            res.finish_reason = "length"
            return True
        return False

