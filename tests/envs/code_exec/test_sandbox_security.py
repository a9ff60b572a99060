"""Adversarial programs against the real bubblewrap sandbox: each is contained, reported with a
clear status, and the host is unchanged. Run with ``-rA -s`` to see what the sandbox returned."""

import pytest

from ludic.envs.code_exec import BubblewrapRunner, CodeExecutor, TestCase
from ludic.envs.code_exec.bwrap import BASE_UID

from .adversarial import CASES, LIMITS, POOL, case_code, check_contained, plant_host, processes_of


class RecordingRunner:
    """The real sandbox, remembering which uid each run used (to check none of it survives)."""

    name = "bubblewrap"

    def __init__(self) -> None:
        self.inner = BubblewrapRunner()
        self.uids: list[int] = []

    async def run(self, code_dir, stdin, limits, *, slot):
        outcome = await self.inner.run(code_dir, stdin, limits, slot=slot)
        self.uids.append(outcome.uid)
        return outcome


@pytest.fixture(scope="module")
def runner():
    return RecordingRunner()


@pytest.fixture(scope="module")
def executor(runner):
    return CodeExecutor(runner, limits=LIMITS, pool_size=POOL)


@pytest.fixture
def host(tmp_path, monkeypatch):
    """A planted secret file, a secret env var and a listening socket, all on the host."""
    monkeypatch.setenv("LUDIC_TEST_SECRET", "TOP-SECRET-ENV")
    planted = plant_host(tmp_path)
    yield planted
    planted["server"].close()


@pytest.mark.parametrize("case", list(CASES))
async def test_adversarial_program_is_contained(case, executor, runner, host):
    result, _ = await executor.evaluate(case_code(case, host), [TestCase(input="", output="42")])
    (test,) = result.tests
    check_contained(case, test.status, test.stdout_head, test.stderr_tail, result.pass_rate, host)
    uid = runner.uids[-1]
    assert uid >= BASE_UID and processes_of(uid) == []
