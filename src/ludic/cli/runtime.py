"""The parts of a run, each built from a validated RunConfig.

``ludic train``, ``ludic eval`` and ``ludic quickstart`` (which turns its flags into a RunConfig) all
get their policy, inference client, rollout engine, requests, algorithm and evaluator here, and
``ludic.cli.run_config.build_train_run`` assembles them into a Trainer for all of them.
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

from ludic.cli.custom_reward import env_factory
from ludic.config import RunConfig
from ludic.inference.sampling import InferenceSpec, SamplingConfig
from ludic.registry import get_algorithm, get_harness, get_protocol
from ludic.training.types import EnvSpec, ProtocolSpec, RolloutRequest


def load_policy(cfg: RunConfig) -> Any:
    """``[model].path`` in ``[model].dtype`` on ``[model].device`` (the model the trainer updates); with
    ``[lora]``, wrapped in peft adapters that alone are trained (``ludic.cli.lora``)."""
    import torch
    from transformers import AutoModelForCausalLM

    from ludic.cli.export import is_adapter, merge_adapter

    if is_adapter(cfg.model.path):  # a LoRA run's checkpoint: its merged model
        model = merge_adapter(cfg.model.path, dtype=cfg.model.dtype).to(cfg.model.device)
    else:
        dtype = getattr(torch, cfg.model.dtype)
        model = AutoModelForCausalLM.from_pretrained(cfg.model.path, dtype=dtype).to(cfg.model.device)
    if cfg.lora is None:
        return model
    from ludic.cli.lora import wrap_policy

    return wrap_policy(model, cfg.lora, cfg.model.path)


def load_tokenizer(cfg: RunConfig) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(cfg.model.tokenizer or cfg.model.path)


def make_client(cfg: RunConfig, policy: Any = None) -> Any:
    """The inference backend named by ``[inference]``. ``policy``: the trainer's model; a ``[lora]`` run
    publishing adapters serves its frozen base from the embedded engine without a second copy."""
    if cfg.inference.backend in ("server", "vllm"):
        from ludic.inference import VLLMChatClient

        return VLLMChatClient(  # each call bounded by [timeouts].http_s, retries included
            base_url=cfg.inference.server_url, enable_weight_updates=True, timeout_s=cfg.timeouts.http_s
        )
    from ludic.inference import TransformersChatClient

    engine_kwargs: dict[str, Any] = dict(
        generate_in_thread=True if cfg.pipeline.enabled else None,  # pipeline: decode beside the trainer
        device=cfg.model.device,
        max_batch_size=cfg.inference.max_batch_size,
        model_name=cfg.model.path,
        dtype=cfg.model.dtype,
    )
    if cfg.lora is not None:
        from ludic.cli.lora import make_shared_engine, shares_base

        if policy is not None and shares_base(cfg):
            return make_shared_engine(cfg, policy, **engine_kwargs)
        engine_kwargs["adapter_serving"] = cfg.lora.serving
    from ludic.cli.export import is_adapter, merge_adapter

    if is_adapter(cfg.model.path):  # a LoRA checkpoint (``ludic eval --model``): served merged
        model = merge_adapter(cfg.model.path, dtype=cfg.model.dtype)
        return TransformersChatClient(model, cfg.model.tokenizer or cfg.model.path, **engine_kwargs)
    return TransformersChatClient(cfg.model.path, cfg.model.tokenizer, **engine_kwargs)


def make_publisher(cfg: RunConfig, client: Any) -> Any:
    """How the trainer's weights reach ``client``'s model: for backend "vllm", vLLM's weight-transfer routes
    with the tensors over a collective (NCCL for a CUDA ``[model].device``, else gloo), the trainer hosting the
    rendezvous on its address towards the server; otherwise ``client.sync_weights`` (the embedded engine in
    place, Ludic's server by its one-blob upload). ``[lora].publish`` says what a LoRA run sends."""
    from ludic.cli.lora import publish_mode
    from ludic.distributed import BroadcastPolicyPublisher, ClientPublisher

    lora = publish_mode(cfg)
    if cfg.inference.backend != "vllm":
        return ClientPublisher(client, lora=lora, timeout_s=cfg.timeouts.publish_s)
    backend = "nccl" if cfg.model.device.startswith("cuda") else "gloo"
    return BroadcastPolicyPublisher(
        client, master_address=address_towards(str(cfg.inference.server_url)), backend=backend, lora=lora,
        timeout_s=cfg.timeouts.publish_s,
    )


def address_towards(url: str) -> str:
    """This host's IP address on the route to ``url``'s host (the address the server can reach the trainer
    at); a loopback server gets 127.0.0.1. No packet is sent (a UDP socket's connect only picks the route)."""
    import socket
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    host = parts.hostname or "127.0.0.1"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect((socket.gethostbyname(host), parts.port or 80))
            return str(probe.getsockname()[0])
    except OSError as exc:
        raise ValueError(f"[inference].server_url {url!r}: no route to its host {host!r} from here ({exc}): the "
                         "server joins the trainer's weight-transfer group at an address of this host") from exc


def make_engine(cfg: RunConfig, client: Any, sampling: SamplingConfig) -> Any:
    """RolloutEngine whose protocol factory builds a fresh agent (harness) per episode; a protocol taking
    ``new_agent`` (``multi_agent``) gets the agent factory instead and builds one agent per seat."""
    from ludic.training.batching import RolloutEngine

    harness = get_harness(cfg.harness.name)
    protocol = get_protocol(cfg.protocol.name)
    tokenizer = getattr(client, "tokenizer", None) or load_tokenizer(cfg)  # token-in for server backends too

    def new_agent() -> Any:
        return harness(
            client=client, model=cfg.model.path, tokenizer=tokenizer, sampling=sampling, **cfg.harness.kwargs
        )

    per_seat = "new_agent" in inspect.signature(protocol).parameters  # e.g. multi_agent: one agent per seat

    def make_protocol(**protocol_kwargs: Any) -> Any:
        if per_seat:
            return protocol(new_agent=new_agent, **protocol_kwargs)
        return protocol(agent=new_agent(), **protocol_kwargs)

    return RolloutEngine(
        env_registry={cfg.env.name: env_factory(cfg)},  # [env].reward bound in, when given
        protocol_registry={cfg.protocol.name: make_protocol},
        one_sequence=cfg.protocol.one_sequence,
    )


def make_requests(
    cfg: RunConfig,
    *,
    first_seed: int,
    n: int,
    sampling: SamplingConfig,
    env_kwargs: dict[str, Any] | None = None,
    run_seed: int = 0,
) -> list[RolloutRequest]:
    """``n`` requests with consecutive env seeds; ``env_kwargs`` override ``[env].kwargs``; sampling seeds
    from the env seeds and ``run_seed`` (training passes the run's seed; held-out evaluations keep the same
    sampling seeds in every run, so runs compare on the same draws)."""
    kwargs = {**cfg.env.kwargs, **(env_kwargs or {})}
    return [
        RolloutRequest(
            env=EnvSpec(kind=cfg.env.name, kwargs=dict(kwargs)),
            protocol=ProtocolSpec(kind=cfg.protocol.name, kwargs=dict(cfg.protocol.kwargs)),
            env_seed=first_seed + i,
            sampling_seed=sampling_seed(run_seed, first_seed + i),
            inference=InferenceSpec(sampling=sampling),
            meta={"env_seed": first_seed + i},
        )
        for i in range(n)
    ]


def sampling_seed(run_seed: int, env_seed: int) -> int:
    """The sampling seed of the episode with ``env_seed`` in the run with ``run_seed``.

    The run's seed must change what is sampled: a pretrained model's run has no random initialisation, so
    with per-request seeds taken from the env seeds alone every ``seed`` gave the same run. Seed 0 keeps
    the env seed itself (the figures measured before stay reproducible)."""
    return (env_seed + run_seed * 1_000_000_007) % 2**31


def make_algorithm(cfg: RunConfig) -> Any:
    """The preset named by ``[algorithm]``; ``group_size`` defaults to ``[rollout].group_size``."""
    preset = get_algorithm(cfg.algorithm.name)
    kwargs = dict(cfg.algorithm.kwargs)
    params = inspect.signature(preset).parameters
    if "group_size" in params:
        kwargs.setdefault("group_size", cfg.rollout.group_size)
    if "teacher_device" in params:  # a frozen teacher runs beside the policy, batched like it
        kwargs.setdefault("teacher_device", cfg.model.device)
        kwargs.setdefault("micro_token_budget", cfg.trainer.micro_token_budget)
    return preset(**kwargs)


def make_evaluator(cfg: RunConfig, engine: Any, out_dir: Path, reducers: dict[str, Any] | None = None) -> Any:
    """The held-out episodes of ``[eval]``, played on ``engine`` with ``[eval].sampling``.

    Besides the mean reward, ``eval/accuracy`` is the fraction of steps whose env info says
    ``correct`` (envs that judge answers: dataset_qa, reasoning_gym, ...); left out for other envs."""
    from ludic.cli.preflight import eval_env_kwargs
    from ludic.eval import Evaluator
    from ludic.training.stats import Reducer

    sampling = cfg.eval.sampling.to_sampling()
    requests = make_requests(
        cfg,
        first_seed=cfg.eval.seed_offset,
        n=cfg.eval.num_episodes,
        sampling=sampling,
        env_kwargs=eval_env_kwargs(cfg),
    )
    return Evaluator(
        engine=engine,
        requests=requests,
        max_steps=cfg.rollout.max_steps,
        sampling=sampling,
        concurrency=cfg.eval.concurrency,
        out_dir=out_dir,
        reducers={"accuracy": Reducer(kind="mean", source="correct", transform=float), **(reducers or {})},
    )


class GroupedRequests:
    """``request_fn``: ``prompts_per_step`` fresh env seeds per call (RolloutBatchSource groups them)."""

    def __init__(self, cfg: RunConfig, sampling: SamplingConfig, first_seed: int | None = None) -> None:
        self.cfg, self.sampling = cfg, sampling
        self.next_seed = cfg.rollout.seed if first_seed is None else first_seed

    def __call__(self) -> list[RolloutRequest]:
        n = self.cfg.rollout.prompts_per_step
        base = make_requests(
            self.cfg, first_seed=self.next_seed, n=n, sampling=self.sampling, run_seed=self.cfg.seed
        )
        self.next_seed += n
        return base

    def state_dict(self) -> dict[str, Any]:
        """The data position: the next env seed (the batch source saves its group counter itself)."""
        return {"next_seed": self.next_seed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.next_seed = int(state["next_seed"])


def make_rollout_source(cfg: RunConfig, engine: Any, algo: Any, first_seed: int | None = None) -> Any:
    """A RolloutBatchSource of ``[rollout]`` GRPO groups from ``first_seed`` (default ``[rollout].seed``)."""
    from ludic.training.batching import RolloutBatchSource

    return RolloutBatchSource(
        engine=engine,
        request_fn=GroupedRequests(cfg, cfg.rollout.sampling.to_sampling(), first_seed),
        algorithm=algo,
        max_steps=cfg.rollout.max_steps,
        concurrency=cfg.rollout.concurrency,
    )
