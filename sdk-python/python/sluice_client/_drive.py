"""Carrying out an ``Engine`` plan: with threads (``run_sync``) or asyncio
(``run_async``). Only waiting lives here: for a turn in a queue, for a held host, for a
retry's delay; and the sending itself, through the function the transport gives.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Awaitable, Callable, Optional

from ._engine import ACQUIRE, DISCARD, HOLD, SEND, SLEEP, Call, Engine, Outcome
from ._queue import GO, SLEEP as STEP_SLEEP, Permit, Queues
from .errors import QueueTimeout


def _deadline(timeout: Optional[float]) -> Optional[float]:
    return None if timeout is None else time.monotonic() + timeout


def _wait_for(step_ms: Optional[int], deadline: Optional[float], key: str, timeout: Optional[float]) -> Optional[float]:
    """Seconds to wait for a step (``None``: until woken), within the deadline; raises
    ``QueueTimeout`` once it has passed."""
    wait = None if step_ms is None else step_ms / 1000
    if deadline is None:
        return wait
    left = deadline - time.monotonic()
    if left <= 0:
        raise QueueTimeout(key, timeout or 0.0)
    return left if wait is None else min(wait, left)


# Threads -----------------------------------------------------------------------------


def acquire_sync(queues: Queues, key: str, call: Call) -> Permit:
    """Blocks until the request's turn in bucket ``key``; raises ``QueueFull`` at once when
    the queue is full, ``QueueTimeout`` after ``call.queue_timeout``. However it ends, the
    request leaves the queue."""
    deadline = _deadline(call.queue_timeout)
    with queues.lock:
        place = queues.join(key, call.cost)
        try:
            while True:
                kind, value = queues.step(place)
                if kind == GO:
                    assert isinstance(value, Permit)
                    return value
                ms = value if kind == STEP_SLEEP else None
                assert ms is None or isinstance(ms, int)
                place.bucket.cond.wait(_wait_for(ms, deadline, key, call.queue_timeout))
        finally:
            queues.leave(place)


def run_sync(engine: Engine, call: Call, send: Callable[[], Any], discard: Callable[[Any], None]) -> Outcome:
    """Sends ``call`` with ``send`` on this thread, as ``engine.plan`` says."""
    plan = engine.plan(call)
    try:
        command = next(plan)
        while True:
            kind = command[0]
            reply: Any = None
            if kind == ACQUIRE:
                reply = acquire_sync(engine.queues, command[1], call)
            elif kind == HOLD:
                while (ms := engine.held_ms(command[1])) > 0:
                    time.sleep(ms / 1000)
            elif kind == SEND:
                try:
                    reply = (send(), None)
                except Exception as error:  # handed to the plan, which retries or raises it
                    reply = (None, error)
            elif kind == DISCARD:
                discard(command[1])
            elif kind == SLEEP:
                time.sleep(command[1] / 1000)
            command = plan.send(reply)
    except StopIteration as stop:
        return stop.value
    finally:
        plan.close()


# asyncio -----------------------------------------------------------------------------


async def acquire_async(queues: Queues, key: str, call: Call) -> Permit:
    """As ``acquire_sync``, on the running event loop; a cancelled task leaves the queue."""
    loop = asyncio.get_running_loop()
    deadline = _deadline(call.queue_timeout)
    with queues.lock:
        place = queues.join(key, call.cost)
    try:
        while True:
            with queues.lock:
                kind, value = queues.step(place)
                if kind == GO:
                    assert isinstance(value, Permit)
                    return value
                woken: "asyncio.Future[None]" = loop.create_future()
                place.bucket.futures.add(woken)
            ms = value if kind == STEP_SLEEP else None
            assert ms is None or isinstance(ms, int)
            try:
                wait = _wait_for(ms, deadline, key, call.queue_timeout)
                timer = None if wait is None else loop.call_later(wait, _wake, woken)
                try:
                    await woken
                finally:
                    if timer is not None:
                        timer.cancel()
            finally:
                with queues.lock:
                    place.bucket.futures.discard(woken)
    finally:
        with queues.lock:
            queues.leave(place)


def _wake(fut: "asyncio.Future[None]") -> None:
    if not fut.done():
        fut.set_result(None)


async def run_async(
    engine: Engine,
    call: Call,
    send: Callable[[], Awaitable[Any]],
    discard: Callable[[Any], Awaitable[None]],
) -> Outcome:
    """Sends ``call`` with ``send`` on the running event loop, as ``engine.plan`` says."""
    plan = engine.plan(call)
    try:
        command = next(plan)
        while True:
            kind = command[0]
            reply: Any = None
            if kind == ACQUIRE:
                reply = await acquire_async(engine.queues, command[1], call)
            elif kind == HOLD:
                while (ms := engine.held_ms(command[1])) > 0:
                    await asyncio.sleep(ms / 1000)
            elif kind == SEND:
                try:
                    reply = (await send(), None)
                except Exception as error:  # handed to the plan, which retries or raises it
                    reply = (None, error)
            elif kind == DISCARD:
                await discard(command[1])
            elif kind == SLEEP:
                await asyncio.sleep(command[1] / 1000)
            command = plan.send(reply)
    except StopIteration as stop:
        return stop.value
    finally:
        plan.close()
