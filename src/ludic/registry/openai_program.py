"""The ``openai_program`` protocol kind: a ``ludic train`` config names an OpenAI-SDK agent program.

    imports = ["my_programs.py"]             # the user's module (ludic.registry.user_modules)
    [inference]
    backend = "server"                       # the program calls an HTTP server: Ludic's or vLLM
    server_url = "http://127.0.0.1:8000"
    [protocol]
    name = "openai_program"
    kwargs = { program = "my_programs:draft_then_revise" }

The program gets an ``openai`` client pointed at ``[inference].server_url`` + ``/v1`` (or ``base_url``);
see ``ludic.interaction.openai_program`` for what is recorded and what fails an episode.
"""

from __future__ import annotations

import importlib
from typing import Any


def resolve_program(target: str) -> Any:
    """``"module:function"`` -> the callable (the module imported now); ValueError naming what is wrong."""
    if not isinstance(target, str) or target.count(":") != 1 or not all(target.split(":")):
        raise ValueError(f"openai_program: program must look like 'module:function', got {target!r}")
    module_name, attr = target.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"openai_program: cannot import {module_name!r} for program {target!r}: {exc} "
                         "(name the module in the config's imports, or put it on sys.path)") from exc  # fmt: skip
    program = getattr(module, attr, None)
    if not callable(program):
        raise ValueError(f"openai_program: {module_name!r} has no callable {attr!r} (program {target!r})")
    return program


def openai_program_protocol(
    *,
    agent: Any,
    program: str,
    base_url: str | None = None,
    timeout_s: float | None = 300.0,
    attach_token_ids: bool = True,
) -> Any:
    """``OpenAIProgramProtocol`` running ``program`` ("module:function") against the run's server.

    base_url: the OpenAI-compatible ``/v1`` root; default: the run's server (``[inference].server_url``).
    attach_token_ids: False for vLLM (its chat route re-renders replies; calls then train as separate items).
    The run's harness (``agent``) is used only for its client's URL and model name: the program samples.
    """
    from ludic.interaction.openai_program import OpenAIProgramProtocol

    fn = resolve_program(program)
    if base_url is None:
        server = getattr(getattr(agent, "client", None), "base_url", None)
        if not server:
            raise ValueError("openai_program: the program calls an HTTP server; set [inference] backend = "
                             "\"server\" with server_url, or [protocol].kwargs.base_url")  # fmt: skip
        base_url = server.rstrip("/") + "/v1"
    model = str(getattr(agent, "model", None) or "ludic")
    return OpenAIProgramProtocol(fn, base_url=base_url, model=model, timeout_s=timeout_s,
                                 attach_token_ids=attach_token_ids)  # fmt: skip
