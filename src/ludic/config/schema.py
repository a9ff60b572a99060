"""The run-config schema read by ``ludic train`` / ``ludic eval``: one pydantic model per table.

Each field is documented once, by the docstring under it (``use_attribute_docstrings``: it is the
field's ``description``). ``[trainer]`` and ``[checkpoint]`` are ``TrainerConfig`` /
``CheckpointConfig`` themselves, so every trainer knob is configurable without being repeated here.

Adding a table: write a ``Section`` subclass (fields + docstrings, value checks in a
``model_validator(mode="after")``) and add one field to :class:`RunConfig`. ``parse_config``
validates in pydantic's strict JSON mode: a string is never turned into a number, an int is
accepted where a float is expected, a list where a tuple is. Avoid ``mode="before"`` validators:
they hand nested tables to Python-mode validation, where a list is no longer a tuple.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, PrivateAttr, model_validator

from ludic.config.cluster_section import ClusterSection
from ludic.config.logging_section import LoggingSection
from ludic.config.lora_section import LoraSection
from ludic.config.section_base import Section, _at_least
from ludic.config.timeouts_section import TimeoutsSection
from ludic.inference.sampling import SamplingConfig
from ludic.training.config import CheckpointConfig, TrainerConfig


class ModelSection(Section):
    path: str
    """Local model directory (or hub name) loaded with ``from_pretrained``."""
    tokenizer: str | None = None
    """Tokenizer directory if different from ``path``."""
    device: str = "cpu"
    """Torch device for the trainer and the embedded engine."""
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    """Parameter dtype of the trained model (and of the SFT warm start)."""


class ComponentSection(Section):
    name: str
    """Registry name (``ludic list`` shows them)."""
    kwargs: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments passed to the registered factory."""


class EnvSection(ComponentSection):
    reward: str | None = None
    """Your own reward, ``"module:function"`` (a dotted module or a ``.py`` path relative to this file), for the
    data-set kinds (``dataset_qa``): ``function(reply, target, row) -> float`` replaces exact match; the
    held-out split and demonstrations stay the kind's own. Checked (imported and called once) by ``--dry-run``."""

    @model_validator(mode="after")
    def _check(self) -> EnvSection:
        if self.reward is not None:
            module, sep, function = self.reward.rpartition(":")
            if not sep or not module.strip() or not function.isidentifier():
                raise ValueError(f"reward must be 'module:function' (e.g. 'my_rewards:score'), got {self.reward!r}")
        return self


class HarnessSection(ComponentSection):
    name: str = "plain"
    """Registry name of the harness (the agent built per episode)."""


class ProtocolSection(ComponentSection):
    name: str = "single_agent"
    """Registry name of the interaction protocol."""
    one_sequence: bool = False
    """Train each rollout as one exact token sequence where its model calls' ids extend each other (a
    multi-turn agent with ``exact_sequence``, an OpenAI program sending ``token_ids`` back), one item
    per call otherwise."""


class AlgorithmSection(ComponentSection):
    name: str = "grpo"
    """Registry name of the algorithm preset."""


class SamplingSection(Section):
    temperature: float = 1.0
    """0 means greedy."""
    top_p: float = 1.0
    """Nucleus mass."""
    max_tokens: int = 64
    """Completion cap in tokens."""
    stop: list[str] = Field(default_factory=list)
    """Stop strings."""

    @model_validator(mode="after")
    def _check(self) -> SamplingSection:
        self.to_sampling()  # SamplingConfig's own checks, with its messages
        return self

    def to_sampling(self, seed: int | None = None) -> SamplingConfig:
        return SamplingConfig(self.temperature, self.top_p, self.max_tokens, tuple(self.stop), seed)


class EvalSamplingSection(SamplingSection):
    temperature: float = 0.0
    """0 means greedy: a held-out evaluation is greedy unless it says otherwise."""


class InferenceSection(Section):
    backend: Literal["embedded", "server", "vllm"] = "embedded"
    """"embedded" (the in-process engine), "server" (Ludic's server at server_url; weights as one upload to
    its /ludic/update_weights_blob) or "vllm" (``vllm serve``, or Ludic's server, at server_url; weights over
    vLLM's weight-transfer routes and a collective: NCCL when [model].device is CUDA, else gloo)."""
    server_url: str | None = None
    """The server's base URL (backends "server" and "vllm" only)."""
    max_batch_size: int = 64
    """The embedded engine's largest generation batch."""

    @model_validator(mode="after")
    def _check(self) -> InferenceSection:
        remote = self.backend != "embedded"
        if remote and not self.server_url:
            raise ValueError(f"backend {self.backend!r} needs server_url (e.g. 'http://127.0.0.1:8000')")
        if not remote and self.server_url:
            raise ValueError(f"server_url={self.server_url!r} is set but backend is 'embedded'")
        if remote and "max_batch_size" in self.model_fields_set:
            raise ValueError(
                f"max_batch_size sizes the embedded engine's batches; with backend {self.backend!r} pass "
                "--max-batch-size to the server when starting it"
            )
        _at_least(self, 1, "max_batch_size")
        return self


class PipelineSection(Section):
    enabled: bool = False
    """Pipeline mode: actors generate into a Redis stream while the trainer trains (docs/pipeline_rl.md)."""
    actors: int = 1
    """Actor tasks in the trainer's process, each playing [rollout] batches on the inference client
    (0: actors are started on their own, e.g. examples/pipeline_rl/run_actor.py, with redis_url)."""
    max_staleness: int = 1
    """Drop items more than this many policy versions behind the trainer (0: synchronous training)."""
    redis_url: str | None = None
    """An existing Redis (redis://:password@host:port/0); default: a private server whose append-only
    data lives in <logging.output_dir>/redis, so a resumed run finds its stream."""
    run_id: str = "train"
    """The run's stream name (one stream per run)."""
    on_stream_reset: Literal["raise", "warn"] = "raise"
    """When Redis lost the run's stream (restarted empty): stop with an error naming the counts (raise), or
    log it and go on with what Redis holds now (warn; the items pushed and not consumed are lost)."""

    @model_validator(mode="after")
    def _check(self) -> PipelineSection:
        _at_least(self, 0, "actors", "max_staleness")
        if self.enabled and self.actors == 0 and not self.redis_url:
            raise ValueError("actors = 0 needs redis_url: actors started on their own must find the stream")
        if not self.run_id or ":" in self.run_id:
            raise ValueError(f"run_id must be a non-empty name without ':', got {self.run_id!r}")
        return self


class RolloutSection(Section):
    prompts_per_step: int = 4
    """Distinct env seeds per training step."""
    group_size: int = 8
    """Completions per prompt (GRPO group)."""
    max_steps: int = 1
    """Env steps per episode."""
    concurrency: int = 64
    """Episodes run at once."""
    seed: int = 0
    """First training env seed (seeds count up from here)."""
    sampling: SamplingSection = Field(default_factory=SamplingSection)
    """Decoding for training rollouts."""

    @model_validator(mode="after")
    def _check(self) -> RolloutSection:
        _at_least(self, 1, "prompts_per_step", "group_size", "max_steps", "concurrency")
        return self


class EvalSection(Section):
    num_episodes: int = 32
    """Held-out episodes per evaluation."""
    seed_offset: int = 1_000_000
    """Held-out env seeds are seed_offset, seed_offset + 1, ..."""
    concurrency: int = 32
    """Episodes run at once."""
    every_n_steps: int = 0
    """Evaluate during training every N steps (0: only before and after)."""
    sampling: EvalSamplingSection = Field(default_factory=lambda: EvalSamplingSection())
    """Decoding for evaluation (temperature 0 = greedy, also when the table sets other keys only)."""
    env_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Overrides of ``[env].kwargs`` for evaluation (e.g. a held-out test file)."""

    @model_validator(mode="after")
    def _check(self) -> EvalSection:
        _at_least(self, 1, "num_episodes", "concurrency")
        _at_least(self, 0, "every_n_steps")
        return self


class SftSection(Section):
    steps: int
    """SFT steps before RL (one batch each)."""
    lr: float = 1e-3
    """SFT learning rate (constant; the run's other ``[trainer]`` settings apply)."""
    batch_size: int = 16
    """Demonstrations per SFT step."""
    demonstrations: str | None = None
    """A JSONL file of demonstrations (relative to the current folder, as ``[env]`` paths are): one
    ``{"prompt": "...", "answer": "..."}`` or ``{"messages": [..., {"role": "assistant", ...}]}`` per line."""
    from_env: bool = False
    """Take demonstrations from the training env (env kinds with a ``demonstrations(n, seed)`` method:
    ``dataset_qa`` with a ``path``, ``reasoning_gym``); steps x batch_size of them, each seen once."""
    seed: int | None = None
    """Which demonstrations and in what order (default: the run's seed)."""

    @model_validator(mode="after")
    def _check(self) -> SftSection:
        _at_least(self, 1, "steps", "batch_size")
        if not self.lr > 0:
            raise ValueError(f"lr must be > 0, got {self.lr}")
        if (self.demonstrations is None) == (not self.from_env):
            raise ValueError("give demonstrations = 'file.jsonl' or from_env = true (exactly one)")
        return self


class RunConfig(Section):
    """A whole run, described by names and keyword arguments."""

    model: ModelSection
    """The policy model."""
    env: EnvSection
    """The environment (registry name + kwargs)."""
    harness: HarnessSection = Field(default_factory=HarnessSection)
    """The agent harness."""
    protocol: ProtocolSection = Field(default_factory=ProtocolSection)
    """The interaction protocol."""
    algorithm: AlgorithmSection = Field(default_factory=AlgorithmSection)
    """The algorithm preset; ``group_size`` defaults to ``[rollout].group_size``."""
    inference: InferenceSection = Field(default_factory=InferenceSection)
    """Where rollouts are generated."""
    rollout: RolloutSection = Field(default_factory=RolloutSection)
    """How training rollouts are requested."""
    pipeline: PipelineSection = Field(default_factory=PipelineSection)
    """Pipeline mode (actors and trainer over a Redis stream)."""
    eval: EvalSection = Field(default_factory=EvalSection)
    """Held-out evaluation."""
    logging: LoggingSection = Field(default_factory=LoggingSection)
    """Outputs."""
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    """Keyword arguments of ``TrainerConfig`` (checked against it)."""
    sft: SftSection | None = None
    """An SFT warm start before RL (``ludic train`` only; a resumed run does not redo it)."""
    cluster: ClusterSection | None = None
    """The hosts of a multi-host run: servers, Redis, the trainer's rendezvous (docs/cluster.md)."""
    timeouts: TimeoutsSection = Field(default_factory=TimeoutsSection)
    """How long each wait may last: collectives, HTTP, publishes, Redis, queues, the step watchdog."""
    lora: LoraSection | None = None
    """Train LoRA adapters on the frozen ``[model]`` instead of every weight (``ludic export`` merges them)."""
    checkpoint: CheckpointConfig | None = None
    """Keyword arguments of ``CheckpointConfig``; ``output_dir`` defaults to ``<logging.output_dir>/checkpoints``."""
    steps: int = 100
    """Training steps for ``ludic train``."""
    seed: int = 0
    """Torch seed."""
    imports: list[str] = Field(default_factory=list)
    """The user's modules to import before names are looked up, so their envs, harnesses, protocols and
    algorithms register themselves: dotted names (``my_envs``) or ``.py`` paths relative to this file."""
    _source: str = PrivateAttr(default="<config>")
    _folder: str = PrivateAttr(default=".")

    @model_validator(mode="after")
    def _check(self) -> RunConfig:
        _at_least(self, 0, "steps")
        lora, backend = self.lora, self.inference.backend
        if lora is not None and backend != "embedded" and "serving" in lora.model_fields_set:
            raise ValueError(f"[lora].serving sets how the embedded engine serves an adapter; with backend "
                             f"{backend!r} pass --adapter-serving to the server when starting it")  # fmt: skip
        if lora is not None and backend == "vllm" and lora.publish == "adapter":
            raise ValueError('[lora].publish = "adapter" cannot reach backend "vllm": vLLM serves a runtime '
                             "adapter only under its own model name, never as the policy the run samples; "
                             'set [lora] publish = "merged" (merged weights over vLLM\'s weight routes), or '
                             'backend = "server" for Ludic\'s server, which takes the adapter alone')  # fmt: skip
        blank = [i for i, name in enumerate(self.imports) if not name.strip()]
        if blank:
            raise ValueError(f"imports[{blank[0]}] is empty; give a module name or a .py path")
        return self

    @property
    def source(self) -> str:
        """The file this config came from (set by the loader; not a config key)."""
        return self._source

    @property
    def folder(self) -> str:
        """The folder of that file (``.py`` paths in ``imports`` and ``[env].reward`` are relative to it)."""
        return self._folder
