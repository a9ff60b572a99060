"""Configuration records for the Trainer and its checkpoints, validated when built."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

from ludic.kernels import CpuKernels, cpu_kernels_setting
from ludic.training.schedule import LR_SCHEDULES

_DEFAULT_LR = 1e-5


@dataclass
class TrainerConfig:
    """How the Trainer optimises (one documented line per field; doubles as CLI help).

    model_device: device the model is moved to and batches are collated on ("cpu", "cuda", "cuda:1").
    lr: AdamW learning rate (``learning_rate=`` is accepted as an alias).
    weight_decay: AdamW decoupled weight decay.
    betas: AdamW (beta1, beta2). lr/weight_decay/betas build the Trainer's AdamW; with
        ``Trainer(optimizer=...)`` the optimizer's own settings are used and setting any of these
        three here is a ValueError (one place for each number).
    lr_schedule: "constant", "linear" or "cosine" (decay to 0 at ``total_steps``), after
        ``warmup_steps`` of linear warm-up; applied to the Trainer's optimizer (its own or a given
        one) unless ``Trainer(lr_scheduler=...)`` is passed (then this must stay "constant" with
        no warm-up).
    warmup_steps: optimizer steps of linear warm-up from lr/warmup_steps to lr; 0 = none.
    total_steps: step at which a "linear"/"cosine" schedule reaches 0 (required by those).
    max_seq_len: sequences longer than this are truncated before batching.
    micro_token_budget: padded tokens per micro-batch (max_len_in_batch * count <= budget); >= max_seq_len.
    max_grad_norm: clip the global gradient norm to this value; None turns clipping off.
    pad_token_id: token id used to right-pad micro-batches; None (default) takes the model's
        ``config.pad_token_id`` (what its tokenizer pads with), else its ``config.eos_token_id``
        (0 for a model with neither; padded positions are masked out either way).
    sync_every_steps: publish weights every N optimizer steps; 0 = never. Left unset (None) it is 1,
        and a Trainer built without a publisher then simply publishes nothing; set explicitly > 0
        without a publisher it is an error.
    log_every: call the train logger every N steps.
    eval_every_n_steps: run the evaluator every N steps; None = never.
    eval_concurrency: concurrency passed to ``evaluator.evaluate``.
    max_lag: drop items whose ``meta["policy_version"]`` lags the trainer's step by more than this; None = keep all.
    gradient_checkpointing: trade compute for activation memory (HF ``gradient_checkpointing_enable``).
    pack_sequences: train padding-free, sequences end to end in rows (tested architectures; others pad).
    share_prompt_prefix: when packing, run each distinct prompt of a micro-batch once (GRPO groups).
    block_attention: packed rows of a model on SDPA run attention by blocks, each sequence, shared
        prompt and tail against its own keys only (``kernels/cpu/segment_attention.py``), instead of over
        the rows' dense 4D mask; same values to float rounding. False: the dense mask.
    seed: if set, seeds python/numpy/torch when the Trainer is built.
    step_in_thread: run each step's compute (forward, backward, optimizer step, publish) on one worker
        thread, so the event loop keeps serving actors and the embedded engine meanwhile (pipeline RL
        in one process); the numbers are the same as on the loop's thread.
    onednn_linears: for fp32 weights on the CPU, run the training forward's and backward's linear layers
        through oneDNN instead of torch's default BLAS (``kernels/cpu/onednn_linear.py``: 1.5x the forward +
        backward of a 6M-parameter Qwen2 on the AMD EPYC measured); gradients equal to fp32 rounding, not
        bit for bit. Other dtypes and devices run torch's own path either way.
    cpu_kernels: the CPU speed-ups' one switch (``ludic.kernels.select``): "auto" runs them on a CPU
        model where this torch has the ops they need (a missing private op falls back to the plain path,
        logged once), "on" requires them, "off" runs plain PyTorch; other devices always run plain
        PyTorch (CUDA's block attention is FlexAttention). None: ``$LUDIC_CPU_KERNELS`` (default "auto"),
        the same value the embedded engine reads. ``onednn_linears`` and ``block_attention`` stay as
        overrides: False turns that one kernel off, True uses it where the switch allows.
    keep_head_logits: for losses of token log-probs, the output layer keeps each scored position's
        float32 logits (4 x vocabulary bytes, counted in the micro-batch's activation budget) for the
        backward instead of recomputing them there: one product of the head's three fewer in the
        backward (SmolLM2-135M, 32 x 64 tokens: forward-backward ~8% faster, peak RSS ~70 MiB higher).
    learning_rate: alias of ``lr`` (upstream Ludic's spelling); after construction both hold the same value.
    """

    model_device: str = "cpu"
    lr: float = _DEFAULT_LR
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    lr_schedule: str = "constant"
    warmup_steps: int = 0
    total_steps: int | None = None
    max_seq_len: int = 2048
    micro_token_budget: int = 16384
    max_grad_norm: float | None = 1.0
    pad_token_id: int | None = None
    sync_every_steps: int | None = None
    log_every: int = 1
    eval_every_n_steps: int | None = None
    eval_concurrency: int = 32
    max_lag: int | None = None
    gradient_checkpointing: bool = False
    pack_sequences: bool = True
    share_prompt_prefix: bool = True
    block_attention: bool = True
    seed: int | None = None
    step_in_thread: bool = False
    onednn_linears: bool = True
    cpu_kernels: CpuKernels | None = None
    keep_head_logits: bool = False
    learning_rate: float | None = None
    sync_explicit: bool = field(init=False, default=False, repr=False)

    def __post_init__(self) -> None:
        self._resolve_lr_alias()
        self.sync_explicit = self.sync_every_steps is not None
        if self.sync_every_steps is None:
            self.sync_every_steps = 1
        self.betas = tuple(self.betas)  # type: ignore[assignment]
        self._validate()

    def _resolve_lr_alias(self) -> None:
        if self.learning_rate is not None:
            if self.lr != _DEFAULT_LR and self.lr != self.learning_rate:
                raise ValueError(
                    f"TrainerConfig got lr={self.lr!r} and learning_rate={self.learning_rate!r}; "
                    "they are the same setting, pass only one"
                )
            self.lr = self.learning_rate
        self.learning_rate = self.lr

    def _validate(self) -> None:
        _positive_float("lr", self.lr)
        if not math.isfinite(self.weight_decay) or self.weight_decay < 0:
            raise ValueError(f"TrainerConfig.weight_decay must be >= 0, got {self.weight_decay!r}")
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise ValueError(f"TrainerConfig.betas must be two numbers in [0, 1), got {self.betas!r}")
        cpu_kernels_setting(self.cpu_kernels)  # "auto", "on" or "off" (None: the environment's, checked too)
        if not isinstance(self.keep_head_logits, bool):
            raise ValueError(f"TrainerConfig.keep_head_logits must be true or false, got {self.keep_head_logits!r}")
        _positive_int("max_seq_len", self.max_seq_len)
        _positive_int("micro_token_budget", self.micro_token_budget)
        if self.micro_token_budget < self.max_seq_len:
            raise ValueError(
                f"TrainerConfig.micro_token_budget ({self.micro_token_budget}) must be >= max_seq_len "
                f"({self.max_seq_len}) so that one full-length sequence fits in a micro-batch; raise "
                f"micro_token_budget (e.g. to {self.max_seq_len * 8}) or lower max_seq_len"
            )
        if self.max_grad_norm is not None:
            _positive_float("max_grad_norm", self.max_grad_norm)
        if self.pad_token_id is not None and (not isinstance(self.pad_token_id, int) or self.pad_token_id < 0):
            raise ValueError(
                f"TrainerConfig.pad_token_id must be None (from the model) or an int >= 0, got {self.pad_token_id!r}"
            )
        self._validate_schedule()
        if not isinstance(self.sync_every_steps, int) or self.sync_every_steps < 0:
            raise ValueError(
                f"TrainerConfig.sync_every_steps must be an int >= 0 (0 = never), got {self.sync_every_steps!r}"
            )
        _positive_int("log_every", self.log_every)
        if self.eval_every_n_steps is not None:
            _positive_int("eval_every_n_steps", self.eval_every_n_steps, hint=" (or None to disable)")
        _positive_int("eval_concurrency", self.eval_concurrency)
        if self.max_lag is not None and (not isinstance(self.max_lag, int) or self.max_lag < 0):
            raise ValueError(f"TrainerConfig.max_lag must be None or an int >= 0, got {self.max_lag!r}")

    def _validate_schedule(self) -> None:
        if self.lr_schedule not in LR_SCHEDULES:
            raise ValueError(f"TrainerConfig.lr_schedule must be one of {LR_SCHEDULES}, got {self.lr_schedule!r}")
        if not isinstance(self.warmup_steps, int) or isinstance(self.warmup_steps, bool) or self.warmup_steps < 0:
            raise ValueError(f"TrainerConfig.warmup_steps must be an int >= 0, got {self.warmup_steps!r}")
        if self.total_steps is not None:
            _positive_int("total_steps", self.total_steps, hint=" (or None)")
            if self.warmup_steps > self.total_steps:
                raise ValueError(
                    f"TrainerConfig.warmup_steps ({self.warmup_steps}) must be <= total_steps ({self.total_steps})"
                )
        elif self.lr_schedule != "constant":
            raise ValueError(
                f"TrainerConfig.lr_schedule={self.lr_schedule!r} decays to 0 at total_steps; set total_steps "
                "(usually the num_steps you pass to train)"
            )

    def optimizer_fields_set(self) -> list[str]:
        """Which of lr/weight_decay/betas differ from their defaults (they build the AdamW)."""
        defaults = {"lr": _DEFAULT_LR, "weight_decay": 0.0, "betas": (0.9, 0.999)}
        return [name for name, value in defaults.items() if getattr(self, name) != value]


@dataclass
class CheckpointConfig:
    """Where and how often checkpoints are written.

    output_dir: directory holding ``step_000123/`` folders and ``latest.json``.
    every_n_steps: ``maybe_save`` writes when ``step % every_n_steps == 0``; 0 = only explicit saves.
    max_to_keep: keep the newest N checkpoints, deleting older ones; None = keep all.
    save_optimizer: also write ``optimizer.pt`` (and the scheduler) so training can resume exactly.
    fallback_may_skip_items: let a fallback to an older checkpoint resume a pipeline run although the
        stream items a newer checkpoint consumed were trimmed and will be skipped (default: refuse).
    """

    output_dir: str | Path
    every_n_steps: int = 0
    max_to_keep: int | None = None
    save_optimizer: bool = True
    fallback_may_skip_items: bool = False

    def __post_init__(self) -> None:
        self.output_dir = Path(self.output_dir)
        if not isinstance(self.every_n_steps, int) or self.every_n_steps < 0:
            raise ValueError(
                f"CheckpointConfig.every_n_steps must be an int >= 0 (0 = only explicit saves), "
                f"got {self.every_n_steps!r}"
            )
        if self.max_to_keep is not None and (not isinstance(self.max_to_keep, int) or self.max_to_keep < 1):
            raise ValueError(
                f"CheckpointConfig.max_to_keep must be None (keep all) or an int >= 1, got {self.max_to_keep!r}"
            )


def _positive_int(name: str, value: object, hint: str = "") -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"TrainerConfig.{name} must be an int > 0{hint}, got {value!r}")


def _positive_float(name: str, value: object) -> None:
    if not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"TrainerConfig.{name} must be a finite number > 0, got {value!r}")
