"""What a Sluice transport decides, without doing any I/O: which bucket a request joins,
what its answer's headers say, whether and when it is retried. The decisions themselves are
sluice-core's (``_core``); this module strings them into the Rust SDK's retry loop
(``client.rs``) as a plan of commands, which ``_drive.py`` carries out with threads or
asyncio, so that the loop is written once for both.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Generator, Iterable, Optional, Tuple

from . import _core
from ._queue import Permit, Queues, now_ms
from .options import Options, RetryEvent

#: Routes and held hosts remembered at most; past that the memory starts over.
MAX_ROUTES = 1024

#: The header that makes a non-idempotent request safe to retry.
IDEMPOTENCY_KEY = "idempotency-key"

Headers = Iterable[Tuple[Any, Any]]


@dataclass
class Call:
    """One request as the plan sees it; the transport fills it in."""

    method: str
    host: str
    """``host:port``: the host-level bucket, as ``bucket_key`` in the Rust SDK."""
    path: str
    idempotency_key: bool
    resendable: bool
    """Whether the body can be sent again (bytes, not a stream)."""
    cost: Optional[_core.Cost]
    bucket: Optional[str]
    """A fixed bucket, or ``None`` for the route's."""
    queue_timeout: Optional[float]
    read: Callable[[Any], Tuple[int, Headers]]
    """A response's status and header pairs."""
    is_connect: Callable[[BaseException], bool]
    """Whether an error is a failure to connect."""


@dataclass
class Outcome:
    """The final answer: the response, its quota, the retries taken before it, and whether
    it was a retried status with no retry left."""

    response: Any
    rate_limit: _core.RateLimitInfo
    retries: int
    exhausted: bool


# The commands of a plan, and what the driver sends back for each.
ACQUIRE = "acquire"  # (ACQUIRE, key) -> Permit: the request's turn in its bucket
HOLD = "hold"  # (HOLD, host) -> None: once the host is not held
SEND = "send"  # (SEND,) -> (response, None) or (None, error)
DISCARD = "discard"  # (DISCARD, response) -> None: the response closed
SLEEP = "sleep"  # (SLEEP, ms) -> None

Plan = Generator[Tuple[Any, ...], Any, Outcome]


def fresh_seed() -> int:
    """A seed that differs between clients and processes."""
    return int.from_bytes(os.urandom(8), "little")


class Engine:
    """The state one transport shares between its requests: queues, routes learned, hosts
    held by a global limit, the retry budget and the jitter's random source."""

    def __init__(self, options: Options) -> None:
        self.options = options
        self.queues = Queues(options.queue)
        self.lock = self.queues.lock
        g = options.retry_budget
        self.budget = _core.RetryBudget(float(g.ratio), g.min_retries)
        self.rng = _core.Rng(fresh_seed() if options.seed is None else options.seed)
        self.routes: Dict[str, str] = {}
        self.holds: Dict[str, int] = {}

    # Buckets -------------------------------------------------------------------------

    def bucket_for(self, host: str, path: str) -> str:
        """The bucket a request to ``host`` and ``path`` joins now: ``"host:port"``, or
        ``"host:port policy"`` once a response on this route named its policy."""
        policy = self.routes.get(host + path)
        return host if policy is None else f"{host} {policy}"

    def _learn(self, call: Call, policy: Optional[str]) -> None:
        if policy is None:
            return
        route = call.host + call.path
        if self.routes.get(route) == policy:
            return
        if len(self.routes) >= MAX_ROUTES:
            self.routes.clear()
        self.routes[route] = policy
        self.queues.hand_over(call.host, f"{call.host} {policy}")

    def _hold(self, host: str, ms: int) -> None:
        now = now_ms()
        if len(self.holds) >= MAX_ROUTES:
            self.holds = {h: t for h, t in self.holds.items() if t > now}
            if len(self.holds) >= MAX_ROUTES:
                self.holds.clear()
        self.holds[host] = max(self.holds.get(host, 0), now + ms)

    def held_ms(self, host: str) -> int:
        """How long requests to ``host`` must still wait (a global limit's Retry-After)."""
        with self.lock:
            until = self.holds.get(host)
        return 0 if until is None else max(0, until - now_ms())

    # The retry loop ------------------------------------------------------------------

    def plan(self, call: Call) -> Plan:
        """The commands that send ``call``: wait for its turn, send, read the quota, and
        retry as the options and the retry budget allow. Returns the final ``Outcome``;
        raises the last connection error when no response came."""
        o = self.options
        self.budget.deposit()
        retryable = call.resendable and (
            o.retry_non_idempotent or _core.is_idempotent(call.method) or call.idempotency_key
        )
        b = o.backoff
        backoff = _core.Backoff(b.base_ms, b.cap_ms, b.max_retries, b.max_elapsed_ms, b.jitter)
        started = now_ms()
        retries = 0
        while True:
            key = call.bucket if call.bucket is not None else self.bucket_for(call.host, call.path)
            permit: Permit = yield (ACQUIRE, key)
            try:
                yield (HOLD, call.host)
                response, error = yield (SEND,)
            except BaseException:
                with self.lock:
                    self.queues.failed(permit)
                raise
            requeue = False
            if error is not None:
                with self.lock:
                    self.queues.failed(permit)
                status, info, floor = None, None, None
                worth = o.retry_connection_errors and call.is_connect(error)
            else:
                status, headers = call.read(response)
                info = _core.parse_headers(status, headers, time.time_ns() // 1_000_000)
                with self.lock:
                    requeue = self.queues.answered(permit, info) and status == 429
                    if info.global_ and info.retry_after_ms is not None:
                        self._hold(call.host, info.retry_after_ms)
                    self._learn(call, info.bucket_name)
                worth = status in o.retry_statuses
                floor = info.server_floor_ms if worth else None
            # A refusal from a server that advertises no quota: the bucket's pacer learned
            # from it and holds the bucket, so the request queues again at once (delay 0),
            # spending no retry, for as long as the schedule lets a request be retried at all.
            delay = None
            if retryable and worth:
                requeued = requeue and now_ms() - started <= b.max_elapsed_ms
                delay = 0 if requeued else self._schedule(backoff, started, floor)
            if delay is None:
                if error is not None:
                    raise error
                return Outcome(response, info, retries, exhausted=worth and retryable)
            retries += 1
            if o.on_retry is not None:
                o.on_retry(RetryEvent(key, retries, delay, status, floor, error))
            if response is not None:
                yield (DISCARD, response)
            yield (SLEEP, delay)

    def _schedule(self, backoff: _core.Backoff, started: int, floor: Optional[int]) -> Optional[int]:
        """The delay before the next retry, if the schedule and the budget allow one."""
        with self.lock:
            delay = backoff.next_delay(now_ms() - started, floor, self.rng)
        return delay if delay is not None and self.budget.try_withdraw() else None


def cost_of(cost: Any) -> Optional[_core.Cost]:
    """A request's expected cost: a ``Cost``, a mapping of unit to amount, or ``None``."""
    if cost is None or isinstance(cost, _core.Cost):
        return cost
    return _core.Cost(dict(cost))

