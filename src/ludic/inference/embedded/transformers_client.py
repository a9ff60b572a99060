"""The embedded inference engine: a real ChatClient running a Hugging Face causal LM in-process.

Token-in, token-out: requests may carry ``prompt_token_ids`` (the agent applied the chat template);
responses carry the sampled completion ids and their log-probs. Concurrent ``complete`` calls are
queued and served together, one forward per decoding step for the whole batch, on a worker thread
so the event loop stays free. ``sync_weights`` validates a whole state dict before copying any of
it, and swaps weights only between batches, so every completion comes from exactly one policy.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ludic.inference.embedded._generation import BatchGenerator, RowRequest, RowResult
from ludic.inference.embedded._pause import EnginePauseMixin
from ludic.inference.embedded._rows import TokenSink
from ludic.inference.embedded._scheduler import EngineSchedulerMixin, Region
from ludic.inference.embedded._weights import EngineWeightsMixin
from ludic.inference.embedded.adapters import AdapterState
from ludic.inference.request import ChatCompletionRequest
from ludic.inference.sampling import SamplingConfig
from ludic.inference.weight_sync.pause import PauseGate, version_spans
from ludic.kernels import CpuKernels
from ludic.types import ChatResponse

DTYPES = {"auto": None, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


MAX_CHAT_MESSAGES = 16384
"""Most messages one chat may hold (the template renders every one before the prompt can be measured)."""


class EngineOverloaded(RuntimeError):
    """More requests are pending than ``max_pending`` allows (the server answers 503)."""


@dataclass
class _Pending:
    row: RowRequest
    future: asyncio.Future


class TransformersChatClient(EngineSchedulerMixin, EnginePauseMixin, EngineWeightsMixin):
    """In-process batched generation with per-token log-probs and atomic weight updates
    (``sync_weights``, from ``EngineWeightsMixin``); ``pause`` / ``resume`` with vLLM's modes come from
    ``EnginePauseMixin``; a request arriving while a batch decodes joins it between two steps when it
    can end no later than the batch (``EngineSchedulerMixin``), so short requests are not held up by
    long ones.

    ``generate_in_thread``: True decodes each batch on a worker thread so the event loop stays free
    (episodes, timeouts, other clients); False decodes on the loop's own thread. None (default)
    picks by device: False on a CPU, True elsewhere. On a CPU where the trainer runs in the same
    process, decoding on the loop's thread keeps one OpenMP thread team instead of two that hand
    the cores back and forth. ``bench/bench_engine_thread.py`` (a GRPO step of the tiny model,
    32 episodes x 16 tokens), 2 OpenMP threads on 2 idle cores: 0.088 s/step on the loop's thread vs
    0.211 on a worker thread (2.4x). With OMP_NUM_THREADS=1 on a loaded machine both settings took
    the same time (0.58 vs 0.63 s/step); with 2 OpenMP
    threads on cores that other processes also load (load average 12 on 2 cores), decoding on
    the loop's thread was far slower (7-26 s vs 0.1-0.5 s per decode batch), so pass True, or
    set OMP_NUM_THREADS=1, on a busy machine. False blocks the loop while a batch decodes, which
    matters only when it has other work (``python -m ludic.inference.server`` passes True).

    ``cpu_kernels``: the CPU speed-ups' switch (``ludic.kernels.select``, as ``TrainerConfig.cpu_kernels``):
    "auto" (None: ``$LUDIC_CPU_KERNELS``, default "auto") on the CPU only, "on", "off".
    ``adapter_serving``: how a LoRA adapter is served: "fold" (into the weights; default) or "unmerged"
    (beside them: a cheaper publish, a dearer forward; ``ludic.inference.embedded.unmerged``).
    """

    def __init__(
        self,
        model: str | Path | torch.nn.Module,
        tokenizer: Any = None,
        *,
        device: str | torch.device = "cpu",
        max_batch_size: int = 64,
        model_name: str | None = None,
        generate_in_thread: bool | None = None,
        dtype: str = "auto",
        max_pending: int = 4096,
        cpu_kernels: CpuKernels | None = None,
        adapter_serving: str = "fold",
    ) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size!r}")
        if max_pending < 1:
            raise ValueError(f"max_pending must be >= 1, got {max_pending!r}")
        if dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {dtype!r}")
        self._adapter, self.adapter_serving = AdapterState(adapter_serving), adapter_serving  # checks the mode
        if isinstance(model, (str, Path)):
            model_name = model_name or str(model)
            tokenizer = tokenizer if tokenizer is not None else str(model)
            model = AutoModelForCausalLM.from_pretrained(str(model))
        if DTYPES[dtype] is not None:
            model = model.to(DTYPES[dtype])
        if tokenizer is None:
            raise ValueError("TransformersChatClient needs a tokenizer when given a model object")
        if isinstance(tokenizer, (str, Path)):
            tokenizer = AutoTokenizer.from_pretrained(str(tokenizer))
        self.device = torch.device(device)
        self.model = model.to(self.device).eval()
        self.tokenizer = tokenizer
        self.model_name = model_name or getattr(model.config, "_name_or_path", "") or "embedded"
        self.max_batch_size = max_batch_size
        self.max_pending = max_pending
        if generate_in_thread is None:
            generate_in_thread = self.device.type != "cpu"
        self.generate_in_thread = bool(generate_in_thread)
        self.max_positions = int(getattr(model.config, "max_position_embeddings", 1 << 30))
        self.policy_version = 0
        self._weights_lock = threading.Lock()
        self._generator = BatchGenerator(
            self.model, tokenizer, self._eos_ids(), self._pad_id(), self.device, cpu_kernels=cpu_kernels
        )
        self._pending: list[_Pending] = []
        self._running: list[_Pending] = []  # the batch being decoded (and requests that joined it)
        self._region: Region | None = None
        self._max_token_chars: int | None = None
        self._held = 0  # requests waiting for a resume (counted against max_pending)
        self._worker: asyncio.Task | None = None
        self.gate = PauseGate()

    # ---- set-up helpers -------------------------------------------------------------------
    def _eos_ids(self) -> set[int]:
        ids: set[int] = set()
        gen_eos = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        for value in (self.tokenizer.eos_token_id, gen_eos):
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, (list, tuple)):
                ids.update(int(v) for v in value)
        return ids

    def _pad_id(self) -> int:
        pad = self.tokenizer.pad_token_id
        return int(pad if pad is not None else next(iter(self._eos_ids()), 0))

    @property
    def forward_calls(self) -> int:
        """Number of model forward passes so far (prefills + decoding steps)."""
        return self._generator.forward_calls

    # ---- ChatClient -------------------------------------------------------------------------
    def prompt_ids_for(self, request: ChatCompletionRequest) -> list[int]:
        """The exact prompt ids to sample from: the request's own, or the chat template's."""
        if request.prompt_token_ids is not None:
            ids = list(request.prompt_token_ids)
            vocab = self.model.get_input_embeddings().num_embeddings
            bad = [t for t in ids if t >= vocab]
            if bad:
                raise ValueError(f"prompt_token_ids contains ids {bad[:5]} outside the vocabulary of size {vocab}")
            return ids
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError(
                f"tokenizer of {self.model_name!r} has no chat_template: set tokenizer.chat_template or "
                "send prompt_token_ids"
            )
        text = self.tokenizer.apply_chat_template(
            request.messages, add_generation_prompt=True, tokenize=False,
            **({} if request.tools is None else {"tools": request.tools}),
        )  # fmt: skip
        self._check_chars_fit(len(text), request.sampling.max_tokens, "the rendered chat")  # before tokenising it
        # what apply_chat_template(tokenize=True) does: encode the rendered text, no special tokens added
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    async def complete(self, request: ChatCompletionRequest) -> tuple[ChatResponse, dict[str, Any]]:
        if request.extras:
            raise ValueError(
                f"TransformersChatClient does not support request extras {sorted(request.extras)}; "
                "they are passed through only by VLLMChatClient"
            )
        self.check_chat_fits(request)
        prompt_ids = self.prompt_ids_for(request)
        self.check_fits(len(prompt_ids), request.sampling.max_tokens)
        return await self.complete_ids(prompt_ids, request.sampling, return_logprobs=request.return_logprobs)

    def check_fits(self, prompt_len: int, max_tokens: int) -> None:
        """ValueError unless the prompt plus ``max_tokens`` fits the model's context."""
        if prompt_len + max_tokens > self.max_positions:
            raise ValueError(f"prompt of {prompt_len} tokens + max_tokens {max_tokens} exceeds the model's "
                             f"max_position_embeddings {self.max_positions}")  # fmt: skip

    def check_chat_fits(self, request: ChatCompletionRequest) -> None:
        """ValueError, before any templating, for a chat that cannot fit the context: more than
        ``MAX_CHAT_MESSAGES`` messages (rendering costs ~25 us a message), or messages whose text alone is
        too long (see ``_check_chars_fit``). Tokenising a chat of megabytes takes seconds; this takes
        microseconds. Assistant turns are not counted (a template may drop their reasoning)."""
        if request.prompt_token_ids is not None:
            return
        if len(request.messages) > MAX_CHAT_MESSAGES:
            raise ValueError(f"chat has {len(request.messages)} messages: at most MAX_CHAT_MESSAGES={MAX_CHAT_MESSAGES}")
        chars = sum(len(m.get("content") or "") for m in request.messages if m.get("role") != "assistant")
        self._check_chars_fit(chars, request.sampling.max_tokens, "messages")

    def _check_chars_fit(self, chars: int, max_tokens: int, what: str) -> None:
        """A text of C characters is at least C / (the longest token's characters) tokens."""
        if self._max_token_chars is None:
            self._max_token_chars = max(map(len, self.tokenizer.get_vocab()), default=1)
        least = -(-chars // self._max_token_chars)
        if least + max_tokens > self.max_positions:
            raise ValueError(
                f"{what} hold {chars} characters, at least {least} tokens (at most {self._max_token_chars} "
                f"characters a token), + max_tokens {max_tokens} exceeds the model's "
                f"max_position_embeddings {self.max_positions}"
            )

    async def complete_ids(
        self, prompt_ids: list[int], sampling: SamplingConfig, *, return_logprobs: bool = True,
        on_token: TokenSink | None = None,
    ) -> tuple[ChatResponse, dict[str, Any]]:
        """Sample from exactly ``prompt_ids`` (already checked); the batching core of ``complete``.
        ``on_token(position, id)`` hears each token as it is sampled (on the decoding thread: streaming)."""
        if len(self._pending) + self._held >= self.max_pending:
            raise EngineOverloaded(
                f"{len(self._pending) + self._held} requests already pending (max_pending={self.max_pending}); "
                "retry later"
            )
        if self.gate.paused:  # held, not refused: it starts on resume
            self._held += 1
            try:
                await self.gate.wait_resumed()
            finally:
                self._held -= 1
        loop = asyncio.get_running_loop()
        pending = _Pending(RowRequest(prompt_ids, sampling, on_token=on_token), loop.create_future())
        if not self._try_join(pending):
            self._pending.append(pending)
            if self._worker is None or self._worker.done() or self._worker.get_loop() is not loop:
                self._worker = loop.create_task(self._serve())
        started = time.perf_counter()
        try:
            result, spans = await pending.future
        except asyncio.CancelledError:  # the caller gave up: drop its row, queued or mid-batch
            pending.row.cancelled = True
            if pending in self._pending:
                self._pending.remove(pending)
            raise
        response = self._response(prompt_ids, result, spans[0][1])
        if not return_logprobs:
            response.completion_logprobs = None
        info = {"latency_s": time.perf_counter() - started, "policy_version": spans[0][1],
                "weight_versions": version_spans(spans, len(result.completion_ids))}  # fmt: skip
        return response, info

    async def _serve(self) -> None:
        """Drain the queue in batches; callers that arrive meanwhile form the next batch."""
        while True:
            for _ in range(3):  # let callers woken in the same tick enqueue first
                await asyncio.sleep(0)
            while self.gate.mode in ("abort", "keep"):  # queued rows start on resume
                await asyncio.sleep(0.01)
            if not self._pending:
                return
            batch = self._pending[: self.max_batch_size]
            del self._pending[: self.max_batch_size]
            batch = [p for p in batch if not p.row.cancelled]
            if batch:
                await self._run_batch(batch)

    def score_prompt(self, prompt_ids: list[int]) -> tuple[list[float], int]:
        """(log-prob of each prompt token after the first, at temperature 1; the policy version)."""
        with self._weights_lock, torch.inference_mode():
            logits = self.model(torch.tensor([prompt_ids], device=self.device)).logits[0, :-1].float()
            logps = torch.log_softmax(logits, -1).gather(-1, torch.tensor(prompt_ids[1:], device=self.device)[:, None])
            return logps.squeeze(-1).tolist(), self.policy_version

    def reply_text(self, ids: list[int]) -> str:
        """A completion's text as responses carry it: the end-of-turn id left out (before a stop string's cut)."""
        return self.tokenizer.decode(ids[:-1] if ids and ids[-1] in self._generator.eos_ids else ids, skip_special_tokens=False)

    def _response(self, prompt_ids: list[int], res: RowResult, version: int) -> ChatResponse:
        ids = res.completion_ids
        text = self.reply_text(ids)
        if res.stop_text_end is not None:
            text = text[: res.stop_text_end]
        return ChatResponse(
            text=text,
            finish_reason=res.finish_reason,
            prompt_token_ids=list(prompt_ids),
            completion_token_ids=list(ids),
            completion_logprobs=list(res.logprobs),
            policy_version=version,
        )

    async def get_policy_version(self) -> int:
        return self.policy_version

    def close(self) -> None:
        """Fail any queued requests (the model itself is released with the object)."""
        for p in self._pending:
            if not p.future.done():
                p.future.set_exception(RuntimeError("TransformersChatClient closed"))
        self._pending.clear()


__all__ = ["TransformersChatClient"]
