"""Checks a run config against the registries and the tokenizer before any model loads.

``ludic train/eval`` (``--dry-run`` included) call :func:`preflight` after the schema check: names
that are not registered, keyword arguments a factory does not take, a group size that does not
fit the batch, a ``max_seq_len`` that leaves no room for any action token, and an output directory
that cannot be created (a file in its place, an unwritable parent) are all reported together, each
naming the file and key, in seconds rather than after a model load (or at the first checkpoint).
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ludic.cli.custom_reward import reward_errors
from ludic.cli.demonstrations import sft_errors
from ludic.cli.distributed_run import distributed_errors
from ludic.cli.lora import lora_errors
from ludic.cli.program_prompt import program_prompt_errors
from ludic.cli.run_loggers import logger_errors
from ludic.cli.server_version import server_version_errors
from ludic.config import ConfigError, RunConfig
from ludic.registry import ALGORITHM_REGISTRY, ENV_REGISTRY, HARNESS_REGISTRY, PROTOCOL_REGISTRY

# Arguments ``ludic train`` itself passes (see ludic.registry's call conventions).
_PASSED_BY_RUN = {"harness": ("client", "model", "tokenizer", "sampling"), "protocol": ("agent",)}
_REGISTRIES = {
    "env": ENV_REGISTRY,
    "harness": HARNESS_REGISTRY,
    "protocol": PROTOCOL_REGISTRY,
    "algorithm": ALGORITHM_REGISTRY,
}


def preflight(cfg: RunConfig, *, train: bool) -> None:
    """Raise :class:`ConfigError` listing every problem found; ``train`` adds the training checks."""
    factories, errors = _lookup(cfg)
    errors += _output_dir_errors(cfg) + _tokenizer_errors(cfg)
    for section, factory in factories.items():
        errors += _kwarg_errors(cfg, section, factory)
    if train:
        errors += _group_errors(cfg) + lora_errors(cfg)  # [lora]: peft installed, targets in the model
        errors += logger_errors(cfg)  # [logging] wandb / tensorboard: packages, wandb.init keywords
        errors += distributed_errors(cfg)  # what cannot work under torchrun or with [cluster], and why
        if not errors and cfg.steps > 0:
            errors += _prompt_length_errors(cfg, factories["env"])
            if not errors:  # an OpenAI-SDK program's own messages and tools: its first request, captured
                errors += program_prompt_errors(cfg, factories["env"], factories["protocol"])
    errors += _program_backend_errors(cfg, factories.get("protocol"))
    if not errors:
        built = train and cfg.steps > 0  # the prompt-length check built and reset the training env
        errors += _eval_env_errors(cfg, factories["env"], built) + _seat_errors(cfg, factories["env"])
    if not errors:
        errors += reward_errors(cfg)  # [env].reward: imported and called once
    if not errors and train:
        errors += server_version_errors(cfg)  # [inference].server_url serves the version the run starts from
    if not errors and train:
        errors += sft_errors(cfg)  # the demonstrations file's every line, or the env's demonstrations()
    if errors:
        raise ConfigError([f"{cfg.source}: {line}" for line in errors])


def _lookup(cfg: RunConfig) -> tuple[dict[str, Callable[..., Any]], list[str]]:
    found: dict[str, Callable[..., Any]] = {}
    errors: list[str] = []
    for section, registry in _REGISTRIES.items():
        name = getattr(cfg, section).name
        try:
            found[section] = registry.get(name)
        except KeyError as exc:
            errors.append(f"[{section}].name: {exc.args[0]}")
        except ImportError as exc:
            errors.append(f"[{section}].name: {registry.kind} {name!r} cannot be imported: {exc}")
    return found, errors


def eval_env_kwargs(cfg: RunConfig, env_factory: Callable[..., Any] | None = None) -> dict[str, Any]:
    """``[eval].env_kwargs``, with ``split = "eval"`` first for env kinds that take a ``split``
    (``dataset_qa``, ``reasoning_gym``): evaluations play held-out rows unless the config says otherwise."""
    factory = env_factory or ENV_REGISTRY.get(cfg.env.name)
    held_out = {"split": "eval"} if "split" in _parameters(factory) else {}
    return {**held_out, **cfg.eval.env_kwargs}


def _eval_env_errors(cfg: RunConfig, env_factory: Callable[..., Any], built: bool) -> list[str]:
    """The held-out env must build and reset (a data set with no held-out rows, a TextArena game that cannot
    be played here fail now, not after training); ``built``: the training env was, with the same kwargs."""
    kwargs = eval_env_kwargs(cfg, env_factory)
    if not kwargs and built:
        return []
    try:
        env_factory(**{**cfg.env.kwargs, **kwargs}).reset(seed=cfg.eval.seed_offset)
    except Exception as exc:
        if not kwargs:
            return [f"[env]: building {cfg.env.name!r} with [env].kwargs failed: {type(exc).__name__}: {exc}"]
        return [
            f"[eval].env_kwargs: building the held-out env {cfg.env.name!r} with {kwargs} failed: "
            f"{type(exc).__name__}: {exc}"
        ]
    return []


def _program_backend_errors(cfg: RunConfig, protocol: Callable[..., Any] | None) -> list[str]:
    """An OpenAI-SDK program (``openai_program``) samples over HTTP: with the embedded engine the trained
    weights never reach what it samples from (every step would fail, or train a policy nobody serves)."""
    from ludic.registry.openai_program import openai_program_protocol

    if protocol is not openai_program_protocol or cfg.inference.backend != "embedded":
        return []
    return [
        f"[protocol].name: {cfg.protocol.name!r} runs an OpenAI-SDK program, and an OpenAI-SDK program samples "
        "from an HTTP server that must receive the trained weights; the embedded engine serves no HTTP: set "
        '[inference] backend = "server" with server_url (e.g. python -m ludic.inference.server MODEL)'
    ]


def _seat_errors(cfg: RunConfig, env_factory: Callable[..., Any]) -> list[str]:
    """``[protocol].kwargs.agents`` (multi_agent) must name agents of the env, or every episode fails."""
    agents = cfg.protocol.kwargs.get("agents")
    if not isinstance(agents, list):
        return []
    try:
        known = list(env_factory(**cfg.env.kwargs).agent_ids)
    except Exception as exc:
        return [f"[env]: building {cfg.env.name!r} with [env].kwargs failed: {type(exc).__name__}: {exc}"]
    unknown = [a for a in agents if a not in known]
    if not unknown:
        return []
    return [
        f"[protocol].kwargs.agents: {unknown} are not agents of env {cfg.env.name!r} (its agent_ids: {known})"
    ]


def _call_errors(factory: Callable[..., Any], kwargs: Mapping[str, Any], passed: tuple[str, ...]) -> str | None:
    """Why ``factory(**passed, **kwargs)`` would fail to bind, or None."""
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        return None  # a builtin without a signature: nothing to check
    try:
        signature.bind(**dict.fromkeys(passed), **kwargs)
    except TypeError as exc:
        names = [p for p in signature.parameters if p not in passed and p != "self"]
        return f"{exc} (it takes: {', '.join(names) or 'no keyword arguments'})"
    return None


def _kwarg_errors(cfg: RunConfig, section: str, factory: Callable[..., Any]) -> list[str]:
    name = getattr(cfg, section).name
    calls: list[tuple[str, dict[str, Any]]] = [(f"[{section}].kwargs", dict(getattr(cfg, section).kwargs))]
    if section == "env" and cfg.eval.env_kwargs:
        calls.append(("[eval].env_kwargs", {**cfg.env.kwargs, **eval_env_kwargs(cfg, factory)}))
    if section == "algorithm" and "group_size" in _parameters(factory):
        calls[0][1].setdefault("group_size", cfg.rollout.group_size)
    errors = []
    for key, kwargs in calls:
        passed = _PASSED_BY_RUN.get(section, ())
        if section == "protocol" and "new_agent" in _parameters(factory):
            passed = ("new_agent",)  # one agent per seat (multi_agent), see ludic.registry
        problem = _call_errors(factory, kwargs, passed)
        if problem:
            errors.append(f"{key}: {section} {name!r}: {problem}")
    return errors


def _parameters(factory: Callable[..., Any]) -> Mapping[str, inspect.Parameter]:
    try:
        return inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return {}


def _group_errors(cfg: RunConfig) -> list[str]:
    group = cfg.algorithm.kwargs.get("group_size")
    if group is None or group == cfg.rollout.group_size:
        return []
    return [
        f"[algorithm].kwargs.group_size: {group!r} does not fit the batch: each step plays "
        f"[rollout].prompts_per_step = {cfg.rollout.prompts_per_step} groups of [rollout].group_size = "
        f"{cfg.rollout.group_size} completions; leave it out (it defaults to [rollout].group_size)"
    ]


def _prompt_length_errors(cfg: RunConfig, env_factory: Callable[..., Any]) -> list[str]:
    """The first training prompt, rendered with the chat template, must leave room for an action."""
    from transformers import AutoTokenizer

    from ludic.inference.template_ids import chat_template_ids

    try:
        env = env_factory(**cfg.env.kwargs)
        observations = env.reset(seed=cfg.rollout.seed)
    except Exception as exc:  # the env's own check of its arguments
        return [f"[env]: building {cfg.env.name!r} with [env].kwargs failed: {type(exc).__name__}: {exc}"]
    source = cfg.model.tokenizer or cfg.model.path
    if not Path(source).is_dir():
        return []  # a hub name: not fetched just for this check
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
    except Exception as exc:
        key = "[model].tokenizer" if cfg.model.tokenizer else "[model].path"
        return [f"{key}: cannot load a tokenizer from {source!r}: {type(exc).__name__}: {exc}"]
    if not getattr(tokenizer, "chat_template", None):
        return []  # the harness reports a missing template itself
    shortest = None
    for obs, _info in observations.values():
        messages = [{"role": "user", "content": str(obs)}]
        system = cfg.harness.kwargs.get("system_prompt")
        if isinstance(system, str):
            messages.insert(0, {"role": "system", "content": system})
        n = len(chat_template_ids(tokenizer, messages))
        shortest = n if shortest is None else min(shortest, n)
    if shortest is None or shortest < cfg.trainer.max_seq_len:
        return []
    return [
        f"[trainer].max_seq_len: {cfg.trainer.max_seq_len} leaves no action token: the first prompt of "
        f"env {cfg.env.name!r} (seed {cfg.rollout.seed}) is already {shortest} tokens, so every completion "
        "would be truncated away and nothing learned; raise max_seq_len"
    ]


_TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json", "tokenizer.model", "vocab.json")


def _tokenizer_errors(cfg: RunConfig) -> list[str]:
    """A local model folder with no tokenizer files (a checkpoint written without one) fails every episode
    ("no chat_template"); say so now, with the key that fixes it."""
    source = Path(cfg.model.tokenizer or cfg.model.path)
    if not source.is_dir() or any((source / name).is_file() for name in _TOKENIZER_FILES):
        return []
    if cfg.model.tokenizer:
        return [f"[model].tokenizer: {str(source)!r} holds no tokenizer ({', '.join(_TOKENIZER_FILES)})"]
    return [
        f"[model].path: {str(source)!r} holds no tokenizer ({', '.join(_TOKENIZER_FILES)}); set "
        "[model].tokenizer to the folder of the model it was trained from (e.g. the run's [model].path)"
    ]


def _output_dir_errors(cfg: RunConfig) -> list[str]:
    """Each output directory must exist as a writable directory or be creatable (``mkdir -p``)."""
    dirs = [("[logging].output_dir", Path(cfg.logging.output_dir))]
    if cfg.checkpoint is not None:
        dirs.append(("[checkpoint].output_dir", Path(cfg.checkpoint.output_dir)))
    errors: list[str] = []
    bad: list[Path] = []
    for key, path in dirs:
        if any(path == b or b in path.parents for b in bad):
            continue  # already reported through the directory it lies in
        problem = _unusable_dir(path)
        if problem:
            bad.append(path)
            errors.append(f"{key}: {str(path)!r} {problem}")
    return errors


def _unusable_dir(path: Path) -> str | None:
    """Why ``path`` cannot serve as an output directory, or None."""
    if path.exists():
        if not path.is_dir():
            return "is a file, not a directory; point it at a directory or move the file"
        if not os.access(path, os.W_OK | os.X_OK):
            return "is a directory this user cannot write to"
        return None
    ancestor = next((p for p in path.parents if p.exists()), None)
    if ancestor is None:
        return None
    if not ancestor.is_dir():
        return f"cannot be created: {str(ancestor)!r} is a file, not a directory"
    if not os.access(ancestor, os.W_OK | os.X_OK):
        return f"cannot be created: this user cannot write to {str(ancestor)!r}"
    return None
