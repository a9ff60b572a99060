"""FiniteCheck: an update's NaN/inf check, begun in the background per call and finished by the waiter."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import torch

from ludic.inference.weight_sync.finite_check import FiniteCheck


def tensors(prefix: str, n: int) -> dict[str, torch.Tensor]:
    return {f"{prefix}{i}": torch.randn(256, 64) for i in range(n)}


def test_every_tensor_is_checked_and_the_first_bad_one_in_arrival_order_is_named():
    with ThreadPoolExecutor(max_workers=1) as pool:
        check = FiniteCheck(pool)
        first, second = tensors("a", 5), tensors("b", 5)
        first["a3"][7, 7] = float("inf")
        second["b1"][0, 0] = float("nan")
        check.add(second)  # arrives first
        check.add(first)
        assert check.first_bad() == "b1"
        assert check.seconds > 0


def test_a_clean_update_passes():
    with ThreadPoolExecutor(max_workers=1) as pool:
        check = FiniteCheck(pool)
        check.add(tensors("a", 4))
        check.add(tensors("b", 4))
        assert check.first_bad() is None


def test_the_waiter_checks_what_the_background_thread_has_not_reached():
    """The background worker is held up: first_bad checks the whole queue on its own thread and finds the NaN."""
    release = threading.Event()
    with ThreadPoolExecutor(max_workers=1) as pool:
        pool.submit(release.wait)  # the worker is busy until released
        check = FiniteCheck(pool)
        update = tensors("w", 6)
        update["w5"][1, 2] = float("nan")
        check.add(update)
        result: list[str | None] = []
        waiter = threading.Thread(target=lambda: result.append(check.first_bad()))
        waiter.start()
        waiter.join(timeout=0.5)
        assert waiter.is_alive()  # it waits for the background task queued behind the blocker...
        assert check.seconds > 0  # ...after checking the queue itself (the worker has not started)
        release.set()
        waiter.join(timeout=10)
        assert result == ["w5"]


def test_calls_queued_without_background_wait_for_start_background_or_the_waiter():
    """Shared memory: a call is checked once the next one is reserved (start_background) or at finish."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        check = FiniteCheck(pool)
        check.add(tensors("a", 3), background=False)
        pool.submit(lambda: None).result()  # the worker is idle and has been given nothing
        assert check.seconds == 0
        check.start_background()
        pool.submit(lambda: None).result()  # runs after the background drain
        assert check.seconds > 0
        late = tensors("b", 2)
        late["b1"][0, 0] = float("inf")
        check.add(late, background=False)
        assert check.first_bad() == "b1"  # checked by the waiter itself


def test_a_name_queued_twice_is_checked_both_times():
    """Small tensors are checked in runs; the same name sent in two calls must not hide the second."""
    with ThreadPoolExecutor(max_workers=1) as pool:
        check = FiniteCheck(pool)
        check.add({"w": torch.zeros(8), "x": torch.zeros(8)}, background=False)
        check.add({"w": torch.tensor([0.0, float("nan")])}, background=False)
        assert check.first_bad() == "w"
