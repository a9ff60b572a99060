"""Shared pytest set-up: tensor shapes are checked at run time; ``gpu`` tests skip without CUDA; shared fixtures."""

import os
from collections.abc import Iterator
from pathlib import Path

# Before anything imports ludic: @shape_checked functions check their jaxtyping annotations with
# beartype (ludic.training.shapes), so a wrong shape fails where it enters, naming the dimension.
os.environ.setdefault("LUDIC_CHECK_SHAPES", "1")

import importlib

import pytest
import torch

if os.environ.get("LUDIC_REQUIRE_EXTRAS") == "1":
    # scripts/test.sh (the README's test command, hence CI) installs every extra the tests use, so a test
    # module that would skip for a missing package (reasoning-gym, TextArena, verifiers, openai, ...) fails
    # instead: a missing extra must never hide as a skipped feature.
    def _import_or_fail(modname: str, minversion: str | None = None, reason: str | None = None, **_: object):
        try:
            return importlib.import_module(modname)
        except ImportError as err:
            raise ImportError(f"{modname} must import under scripts/test.sh (bash scripts/setup.sh installs it): {err}") from err

    pytest.importorskip = _import_or_fail  # type: ignore[assignment]


# Test files that need the machine to themselves: scripts/test.sh runs every other test on two workers
# (pytest-xdist), then these one at a time. A file belongs here when its tests start several computing processes
# (ranks, hosts, actors, servers), give a child both cores (ludic.testing.alone_process_env), or hold a
# wall-clock bound that a test computing on the other core could stretch.
RUN_ALONE = (
    # several processes computing at once
    "tests/cluster/",
    "tests/distributed/test_adapter_publish.py",  # a trainer and a server transferring at once
    "tests/distributed/test_broadcast_publisher.py",
    "tests/distributed/test_shared_memory_publisher.py",
    "tests/training/parallel/",
    "tests/training/checkpoint/test_dcp_stalled_rank.py",
    "tests/training/pipeline/test_pipeline_process_faults.py",
    "tests/training/test_watchdog.py",
    "tests/inference/test_multi_server.py",
    "tests/cli/test_resume.py",
    "tests/examples/test_fsdp2_example.py",
    "tests/examples/test_pipeline_rl_publish.py",
    # a child given both cores
    "tests/cli/test_reasoning_gym_learns.py",
    "tests/examples/test_textarena_games_example.py",
    "tests/examples/test_tic_tac_toe_example.py",
    "tests/examples/test_tools_example.py",
    "tests/quickstart/test_quickstart_learns.py",
    # wall-clock bounds within a second or two (a served model's 1-3 s transfer bound, too)
    "tests/distributed/test_adapter_hostile_input.py",
    "tests/distributed/test_shared_memory_ownership.py",
    "tests/distributed/test_weight_update_repeats.py",
    "tests/distributed/test_fanout_publisher.py",
    "tests/training/pipeline/test_pipeline_wait_bounds.py",
    "tests/training/test_step_times.py",
    "tests/inference/vllm/test_http_wait_bounds.py",
    "tests/inference/server/test_chat_stream_incremental.py",
    "tests/inference/embedded/test_engine_limits.py",
    "tests/envs/code_exec/test_sandbox_hardening.py",
    "tests/envs/code_exec/test_compile_bomb.py",
    "tests/agents/test_tool_agents.py",
)
ROOT = Path(__file__).resolve().parent.parent


def listed_to_run_alone(path: str) -> bool:
    """Whether ``path`` (from the repository root) is listed in RUN_ALONE; a listed folder takes in all under it."""
    return any(path == entry or (entry.endswith("/") and path.startswith(entry)) for entry in RUN_ALONE)


def runs_alone(item: pytest.Item) -> bool:
    """Whether ``item``'s file is listed in RUN_ALONE."""
    return listed_to_run_alone(Path(str(item.path)).resolve().relative_to(ROOT).as_posix())


@pytest.hookimpl(tryfirst=True)  # before -m selects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    skip = None if torch.cuda.is_available() else pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if runs_alone(item):
            item.add_marker(pytest.mark.alone)
        if skip is not None and "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model directory (seed 0, ``ludic.testing.build_tiny_model``), built once per test module."""
    from ludic.testing import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny"), seed=0)


@pytest.fixture(scope="module")
def base_url(model_dir: Path) -> Iterator[str]:
    """The OpenAI-compatible base URL (``.../v1``) of Ludic's server, a subprocess on loopback serving ``model_dir``."""
    from ludic.testing.server_process import running_server

    with running_server(model_dir) as url:
        yield url + "/v1"


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two tiny model directories, built once per test module, that differ in every weight.

    ``dirs[0]`` (seed 0) is the one a test serves; ``dirs[1]`` (seed 7) the weights it publishes.
    """
    from ludic.testing import build_tiny_model

    root = tmp_path_factory.mktemp("models")
    return build_tiny_model(root / "a", seed=0), build_tiny_model(root / "b", seed=7)


# Property-based tests (hypothesis): a few hundred examples per property in the default suite, 2.5x as many
# under CI=true (with 1,000 the whole CI took 88 of its 90 minutes on a 2-core Zen 3). No deadline: a busy
# 2-core machine is slow, not wrong.
from hypothesis import HealthCheck, settings  # noqa: E402

settings.register_profile(
    "default", max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "ci", max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile("ci" if os.environ.get("CI") == "true" else "default")


@pytest.fixture(autouse=True)
def _no_leaked_process_hooks() -> Iterator[None]:
    """A test that starts a W&B run leaves wandb's process hooks (its ``sys.exit`` wrapper turns
    ``sys.exit()`` into ``sys.exit(0)``) and its settings singleton behind; later tests get them back clean."""
    import sys

    exit_fn, excepthook = sys.exit, sys.excepthook
    yield
    wandb = sys.modules.get("wandb")
    if wandb is not None and getattr(wandb, "teardown", None) is not None:
        wandb.teardown()
    sys.exit, sys.excepthook = exit_fn, excepthook
