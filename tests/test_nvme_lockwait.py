"""The nvme index lock's release callbacks (tiers/nvme/slots.py, IndexLock), which the native
paths' jobs parked for it wait on (tiers/nvme/lockwait.py; the paths' own tests are in
test_nvme_native.py and test_nvme_native_stores.py)."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from asynctier.tiers.nvme.slots import IndexLock


def test_a_callback_asked_while_held_runs_at_the_release_once() -> None:
    lock = IndexLock()
    calls: list[str] = []
    with lock:
        lock.when_free(lambda: calls.append(threading.current_thread().name))
        assert calls == [] and lock.locked()
    assert calls == [threading.current_thread().name]
    with lock:
        pass
    assert len(calls) == 1  # not again at the next release


def test_a_callback_asked_while_free_runs_at_once() -> None:
    """A release between a failed try and the ask found no one to call."""
    lock = IndexLock()
    calls: list[int] = []
    lock.when_free(lambda: calls.append(1))
    assert calls == [1] and not lock.locked()


def test_the_callback_runs_on_the_releasing_thread() -> None:
    lock = IndexLock()
    taken, release = threading.Event(), threading.Event()
    ran_on: list[str] = []

    def hold() -> None:
        with lock:
            taken.set()
            release.wait(30)

    holder = threading.Thread(target=hold, name="holder")
    holder.start()
    assert taken.wait(30)
    assert not lock.acquire(blocking=False)
    lock.when_free(lambda: ran_on.append(threading.current_thread().name))
    release.set()
    holder.join(30)
    assert ran_on == ["holder"]
    assert lock.acquire(blocking=False)
    lock.release()


def test_a_failing_callback_is_logged_and_the_lock_is_released(caplog: pytest.LogCaptureFixture) -> None:
    lock = IndexLock()
    calls: list[int] = []

    def fail() -> None:
        raise RuntimeError("boom")

    with caplog.at_level(logging.ERROR, logger="asynctier.tiers.nvme.slots"), lock:
        lock.when_free(fail)
        lock.when_free(lambda: calls.append(1))
    assert not lock.locked() and calls == [1]
    assert "a waiter's callback failed" in caplog.text


def test_no_wake_up_is_lost_against_a_thread_taking_and_releasing_the_lock() -> None:
    """Each ask made after a failed try is answered, however the other thread's release falls
    against the ask."""
    lock = IndexLock()
    stop = threading.Event()

    def churn() -> None:
        while not stop.is_set():
            with lock:
                time.sleep(0)  # the GIL handed over while held

    other = threading.Thread(target=churn)
    other.start()
    asked = 0
    try:
        for _ in range(3000):
            if lock.acquire(blocking=False):
                lock.release()
                continue
            answered = threading.Event()
            lock.when_free(answered.set)
            asked += 1
            assert answered.wait(10)
    finally:
        stop.set()
        other.join(30)
    assert asked  # the other thread held it at some of the tries
