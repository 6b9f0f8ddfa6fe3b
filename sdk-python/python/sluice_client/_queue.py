"""The client-side queue: one bounded FIFO per bucket, released at the pace sluice-core's
``Pacer`` gives (the Rust SDK's ``queue.rs``, without its waiting).

Every method here expects the caller to hold ``Queues.lock``; waiting for a turn is the
drivers' job (``_drive.py``: threads or asyncio), woken through ``Bucket.wake``.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import OrderedDict, deque
from typing import Deque, Optional, Set, Tuple, Union

from . import _core
from .errors import QueueFull
from .options import QueueConfig


def now_ms() -> int:
    """The monotonic clock the pacers run on, in milliseconds."""
    return time.monotonic_ns() // 1_000_000


def _resolve(fut: "asyncio.Future[None]") -> None:
    if not fut.done():
        fut.set_result(None)


class Bucket:
    """One bucket's queue: its pacer, the places waiting, the requests in flight."""

    __slots__ = ("key", "pacer", "waiting", "in_flight", "cond", "futures")

    def __init__(self, key: str, config: QueueConfig, lock: threading.Lock) -> None:
        self.key = key
        p = config.pacer
        self.pacer = _core.Pacer(p.reserve, p.margin_percent) if config.pacing else None
        self.waiting: Deque[Place] = deque()
        self.in_flight = 0
        self.cond = threading.Condition(lock)
        self.futures: Set["asyncio.Future[None]"] = set()

    def idle(self) -> bool:
        return not self.waiting and self.in_flight == 0

    def wake(self) -> None:
        """Wakes every waiter of this bucket, thread or task: its head may be able to go."""
        self.cond.notify_all()
        for fut in self.futures:
            try:
                fut.get_loop().call_soon_threadsafe(_resolve, fut)
            except RuntimeError:  # its event loop has closed: no one waits on it any more
                pass


class Place:
    """A request's place in a queue."""

    __slots__ = ("bucket", "cost", "left")

    def __init__(self, bucket: Bucket, cost: Optional[_core.Cost]) -> None:
        self.bucket = bucket
        self.cost = cost
        self.left = False


class Permit:
    """The right to send one request: report how it ended with ``Queues.answered`` or
    ``Queues.failed``."""

    __slots__ = ("bucket", "ticket", "done")

    def __init__(self, bucket: Bucket, ticket: int) -> None:
        self.bucket = bucket
        self.ticket = ticket
        self.done = False


GO, SLEEP, WAIT = "go", "sleep", "wait"
Step = Tuple[str, Union[Permit, int, None]]


class Queues:
    """Every bucket's queue and pacing state, behind one lock."""

    def __init__(self, config: QueueConfig) -> None:
        self.config = config
        self.lock = threading.Lock()
        self.buckets: "OrderedDict[str, Bucket]" = OrderedDict()

    def bucket(self, key: str) -> Bucket:
        """Bucket ``key``, now the most recently used; past ``max_buckets`` the least
        recently used idle bucket is forgotten (a forgotten bucket starts over)."""
        b = self.buckets.get(key)
        if b is not None:
            self.buckets.move_to_end(key)
            return b
        if len(self.buckets) >= self.config.max_buckets:
            for k, old in self.buckets.items():
                if old.idle():
                    del self.buckets[k]
                    break
        b = Bucket(key, self.config, self.lock)
        self.buckets[key] = b
        return b

    def join(self, key: str, cost: Optional[_core.Cost]) -> Place:
        """A place at the back of ``key``'s queue; raises ``QueueFull`` when it has none."""
        b = self.bucket(key)
        if len(b.waiting) >= self.config.capacity:
            raise QueueFull(key, self.config.capacity)
        place = Place(b, cost)
        b.waiting.append(place)
        return place

    def step(self, place: Place) -> Step:
        """What ``place`` does next: ``(GO, permit)``, ``(SLEEP, ms)`` or ``(WAIT, None)``
        (until the bucket wakes it)."""
        b = place.bucket
        if b.waiting[0] is not place:
            return WAIT, None
        max_in_flight = self.config.max_in_flight
        if max_in_flight is not None and b.in_flight >= max_in_flight:
            return WAIT, None
        now = now_ms()
        at = b.pacer.next_send_at(now, place.cost) if b.pacer is not None else now
        if at is None:
            return WAIT, None
        if at > now:
            return SLEEP, at - now
        b.waiting.popleft()
        place.left = True
        ticket = b.pacer.on_send(now, place.cost) if b.pacer is not None else 0
        b.in_flight += 1
        b.wake()  # the next one is at the head now
        return GO, Permit(b, ticket)

    def leave(self, place: Place) -> None:
        """Gives ``place`` up, if its turn has not come."""
        if place.left:
            return
        place.left = True
        place.bucket.waiting.remove(place)
        place.bucket.wake()

    def answered(self, permit: Permit, info: _core.RateLimitInfo) -> bool:
        """The request of ``permit`` got a response advertising ``info``. Returns whether
        its bucket's pacer learns the quota from refusals: a refused request then queues
        again rather than being retried."""
        self._finish(permit, info)
        return permit.bucket.pacer is not None and permit.bucket.pacer.adapts

    def failed(self, permit: Permit) -> None:
        """The request of ``permit`` got no response."""
        self._finish(permit, None)

    def _finish(self, permit: Permit, info: Optional[_core.RateLimitInfo]) -> None:
        if permit.done:
            return
        permit.done = True
        b = permit.bucket
        if b.pacer is not None:
            if info is not None:
                b.pacer.observe(info, now_ms(), permit.ticket)
            else:
                b.pacer.on_failure(permit.ticket)
        b.in_flight -= 1
        b.wake()

    def hand_over(self, host: str, policy: str) -> None:
        """Hands the host bucket over to the policy bucket just learned, unless that exists,
        and leaves the host a fresh bucket (the Rust SDK's ``Queues::hand_over``)."""
        b = self.buckets.pop(host, None)
        if b is not None and policy not in self.buckets:
            b.key = policy
            self.buckets[policy] = b

    def waiting(self, key: str) -> int:
        b = self.buckets.get(key)
        return 0 if b is None else len(b.waiting)
