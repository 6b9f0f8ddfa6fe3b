"""The options of a Sluice transport: the Rust SDK's, by the same names and defaults
(``ClientBuilder``'s methods and ``QueueConfig``'s fields), the defaults read from
sluice-core itself."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Optional, Tuple

from . import _core

_DEFAULTS = _core.defaults()
_B = _DEFAULTS["backoff"]
_G = _DEFAULTS["budget"]
_P = _DEFAULTS["pacer"]


def _whole(where: str, value: Any, least: int = 0) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{where} must be a whole number >= {least}, not {value!r}")


@dataclass(frozen=True)
class BackoffPolicy:
    """The retry schedule: full jitter over ``base_ms * 2**n`` by default, never before the
    server's ``Retry-After``."""

    base_ms: int = _B["base_ms"]
    """First delay's scale (default 1000)."""
    cap_ms: int = _B["cap_ms"]
    """No computed delay exceeds this; a server's ``Retry-After`` may (default 20000)."""
    max_retries: int = _B["max_retries"]
    """Retries after the first attempt; 0 disables retrying (default 5)."""
    max_elapsed_ms: int = _B["max_elapsed_ms"]
    """No retry starts later than this after the first attempt (default 60000)."""
    jitter: str = _B["jitter"]
    """``"full"`` (default) or ``"decorrelated"``."""

    def __post_init__(self) -> None:
        for name in ("base_ms", "cap_ms", "max_retries", "max_elapsed_ms"):
            _whole(f"backoff.{name}", getattr(self, name))
        if self.jitter not in ("full", "decorrelated"):
            raise ValueError(f'backoff.jitter must be "full" or "decorrelated", not {self.jitter!r}')


@dataclass(frozen=True)
class BudgetConfig:
    """The retry budget: at most ``min_retries + ratio * requests`` retries."""

    ratio: float = _G["ratio"]
    """Retries per request, long-run (default 0.1)."""
    min_retries: int = _G["min_retries"]
    """Retries always available, and the most that accumulate (default 10)."""

    def __post_init__(self) -> None:
        if not isinstance(self.ratio, (int, float)) or not self.ratio >= 0:
            raise ValueError(f"retry_budget.ratio must be a number >= 0, not {self.ratio!r}")
        _whole("retry_budget.min_retries", self.min_retries)


@dataclass(frozen=True)
class PacerConfig:
    """The pacer's tuning."""

    reserve: int = _P["reserve"]
    """Requests that may always go back to back within the budget (default 10)."""
    margin_percent: int = _P["margin_percent"]
    """Safety margin on the advertised interval, in percent (default 5)."""

    def __post_init__(self) -> None:
        _whole("pacer.reserve", self.reserve)
        _whole("pacer.margin_percent", self.margin_percent)


@dataclass(frozen=True)
class QueueConfig:
    """The queues: one bounded FIFO per bucket."""

    capacity: int = 1024
    """Requests that may wait in one bucket; one more raises ``QueueFull``."""
    max_in_flight: Optional[int] = None
    """Requests of one bucket in flight at once (default: no limit)."""
    pacing: bool = True
    """Whether requests are paced by the advertised quota."""
    pacer: PacerConfig = field(default_factory=PacerConfig)
    """The pacer's tuning."""
    max_buckets: int = 1024
    """Buckets kept at most; past that the least recently used idle one is forgotten."""

    def __post_init__(self) -> None:
        _whole("queue.capacity", self.capacity)
        if self.max_in_flight is not None:
            _whole("queue.max_in_flight", self.max_in_flight, least=1)
        _whole("queue.max_buckets", self.max_buckets, least=1)


@dataclass(frozen=True)
class RetryEvent:
    """A retry about to be waited for, as given to ``on_retry``. A request refused by a
    server that advertises no quota goes back to its bucket's queue instead, which learns the
    server's rate from the refusals and holds it as long as that takes: it is given with a
    ``delay_ms`` of 0 (the wait is the queue's) and spends no retry budget."""

    key: str
    """The bucket of the request."""
    retry: int
    """Which retry this is (1 for the first)."""
    delay_ms: int
    """How long the transport waits before sending it."""
    status: Optional[int]
    """The status that caused it; ``None`` for a connection error."""
    floor_ms: Optional[int]
    """What the server asked for: ``Retry-After``, or the reset of a spent quota."""
    error: Optional[BaseException] = None
    """The connection error that caused it."""


@dataclass(frozen=True)
class Options:
    """Every option, resolved. Build it with :func:`resolve` from keyword arguments."""

    backoff: BackoffPolicy = field(default_factory=BackoffPolicy)
    retry_statuses: Tuple[int, ...] = (429, 503)
    retry_connection_errors: bool = True
    retry_non_idempotent: bool = False
    retry_budget: BudgetConfig = field(default_factory=BudgetConfig)
    queue: QueueConfig = field(default_factory=QueueConfig)
    on_retry: Optional[Callable[[RetryEvent], None]] = None
    seed: Optional[int] = None
    queue_timeout: Optional[float] = None
    raise_on_exhausted: bool = True
    bucket: Optional[Callable[[Any], Optional[str]]] = None
    cost: Optional[Callable[[Any], Optional[Mapping[str, int]]]] = None


def resolve(
    *,
    backoff: Optional[BackoffPolicy] = None,
    retry_statuses: Optional[Tuple[int, ...]] = None,
    retry_connection_errors: bool = True,
    retry_non_idempotent: bool = False,
    retry_budget: Optional[BudgetConfig] = None,
    queue: Optional[QueueConfig] = None,
    queue_capacity: Optional[int] = None,
    max_in_flight: Optional[int] = None,
    pacing: Optional[bool] = None,
    pacer: Optional[PacerConfig] = None,
    on_retry: Optional[Callable[[RetryEvent], None]] = None,
    seed: Optional[int] = None,
    queue_timeout: Optional[float] = None,
    raise_on_exhausted: bool = True,
    bucket: Optional[Callable[[Any], Optional[str]]] = None,
    cost: Optional[Callable[[Any], Optional[Mapping[str, int]]]] = None,
) -> Options:
    """The options with defaults filled in. As with the Rust ``ClientBuilder``,
    ``queue_capacity``, ``max_in_flight``, ``pacing`` and ``pacer`` set one field of
    ``queue``. Raises ``ValueError`` or ``TypeError`` naming a bad option."""
    q = queue or QueueConfig()
    if queue_capacity is not None:
        q = replace(q, capacity=queue_capacity)
    if max_in_flight is not None:
        q = replace(q, max_in_flight=max_in_flight)
    if pacing is not None:
        q = replace(q, pacing=pacing)
    if pacer is not None:
        q = replace(q, pacer=pacer)
    statuses = (429, 503) if retry_statuses is None else tuple(retry_statuses)
    for s in statuses:
        if isinstance(s, bool) or not isinstance(s, int) or not 100 <= s <= 599:
            raise ValueError(f"retry_statuses must be HTTP status codes, not {s!r}")
    for name, fn in (("on_retry", on_retry), ("bucket", bucket), ("cost", cost)):
        if fn is not None and not callable(fn):
            raise TypeError(f"{name} must be callable")
    if queue_timeout is not None and not queue_timeout >= 0:
        raise ValueError(f"queue_timeout must be a number of seconds >= 0, not {queue_timeout!r}")
    if seed is not None:
        _whole("seed", seed)
    return Options(
        backoff=backoff or BackoffPolicy(),
        retry_statuses=statuses,
        retry_connection_errors=retry_connection_errors,
        retry_non_idempotent=retry_non_idempotent,
        retry_budget=retry_budget or BudgetConfig(),
        queue=q,
        on_retry=on_retry,
        seed=seed,
        queue_timeout=queue_timeout,
        raise_on_exhausted=raise_on_exhausted,
        bucket=bucket,
        cost=cost,
    )
