"""Fixtures of the multi-host tests: simulated hosts (``ludic.testing.netns.HostNetwork``)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from ludic.testing.netns import HostNetwork, unavailable_reason
from ludic.testing.netns_roles import SimulatedCluster

MakeNetwork = Callable[..., HostNetwork]


@pytest.fixture
def host_network() -> Iterator[MakeNetwork]:
    """A factory: ``host_network(["redis", "actor0", ...])`` builds a HostNetwork torn down after the test.

    Teardown (every process killed, every namespace deleted) runs whether the test passed, failed or raised.
    Where namespaces cannot be made, the test fails with the reason under ``LUDIC_REQUIRE_EXTRAS=1`` (CI:
    a multi-host test must never hide as a skip) and is skipped with the reason otherwise.
    """
    reason = unavailable_reason()
    if reason is not None:
        if os.environ.get("LUDIC_REQUIRE_EXTRAS") == "1":
            pytest.fail(f"simulated hosts are required under LUDIC_REQUIRE_EXTRAS=1: {reason}")
        pytest.skip(f"simulated hosts unavailable: {reason}")
    made: list[HostNetwork] = []

    def make(hosts: Sequence[str], **kwargs: object) -> HostNetwork:
        net = HostNetwork(hosts, **kwargs)  # type: ignore[arg-type]
        made.append(net)
        return net

    yield make
    errors = []
    for net in made:
        try:
            net.close()
        except Exception as err:  # close every network before reporting the first failure
            errors.append(err)
    if errors:
        raise errors[0]


@pytest.fixture
def cluster(host_network, tmp_path: Path) -> Callable[[Sequence[str]], SimulatedCluster]:
    """``cluster(hosts)``: a SimulatedCluster (``ludic.testing.netns_roles``) on a fresh network of ``hosts``,
    serving the tiny model (built once per process); logs and outputs under ``tmp_path``."""
    from ludic.testing.tiny_model import tiny_model_path

    model = tiny_model_path()
    return lambda hosts: SimulatedCluster(host_network(list(hosts)), tmp_path, model)
