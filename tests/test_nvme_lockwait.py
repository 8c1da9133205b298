"""The nvme index lock's release callbacks (tiers/nvme/slots.py, IndexLock), which the native
paths' jobs parked for it wait on (tiers/nvme/lockwait.py; the paths' own tests are in
test_nvme_native.py and test_nvme_native_stores.py)."""

from __future__ import annotations

import logging
import random
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


def test_no_wake_up_is_lost_however_the_release_falls_against_the_ask() -> None:
    """Each round the other thread holds the lock, then releases it once and takes it no more
    until the round ends: an ask made after a failed try must be answered by that one release,
    whether it falls before the ask (caught by the ask itself) or after it. A lost wake-up
    fails the round."""
    lock = IndexLock()
    held, go, done = threading.Event(), threading.Event(), threading.Event()
    rng = random.Random(7)
    rounds = 300

    def holder() -> None:
        for _ in range(rounds):
            with lock:
                held.set()
                go.wait(10)
                go.clear()
            done.wait(10)
            done.clear()

    other = threading.Thread(target=holder)
    other.start()
    before = 0
    try:
        for _ in range(rounds):
            assert held.wait(10)
            held.clear()
            assert not lock.acquire(blocking=False)
            go.set()  # the release now races the ask
            if rng.random() < 0.5:
                time.sleep(rng.random() * 1e-4)  # (work between the failed try and the ask)
            answered = threading.Event()
            if not lock.locked():
                before += 1
            lock.when_free(answered.set)
            assert answered.wait(5), "a wake-up was lost"
            done.set()
    finally:
        go.set()
        done.set()
        other.join(30)
    assert 0 < before < rounds  # both orders were met
