"""Types of the extension module (sluice-core through PyO3, ``sdk-python/src``)."""

from typing import Any, Dict, Iterable, List, Mapping, Optional, Tuple, Union

_Text = Union[str, bytes]

class UnitQuota:
    """A quota counted in another unit than requests (``tokens``, …)."""

    unit: str
    limit: Optional[int]
    remaining: Optional[int]
    reset_after_ms: Optional[int]
    window_ms: Optional[int]
    policy: Optional[str]
    def to_dict(self) -> Dict[str, Any]: ...

class RateLimitInfo:
    """The quota a response advertised; a field is ``None`` when no header gave it."""

    limit: Optional[int]
    remaining: Optional[int]
    reset_after_ms: Optional[int]
    retry_after_ms: Optional[int]
    policy: Optional[str]
    window_ms: Optional[int]
    global_: bool
    partition: Optional[str]
    quotas: List[UnitQuota]
    bucket_name: Optional[str]
    server_floor_ms: Optional[int]
    def quota(self, unit: str) -> Optional[UnitQuota]: ...
    def is_empty(self) -> bool: ...
    def to_dict(self) -> Dict[str, Any]: ...

def parse_headers(
    status: int,
    headers: Union[Mapping[str, str], Iterable[Tuple[_Text, _Text]]],
    now_ms: Optional[int] = None,
) -> RateLimitInfo: ...

class Cost:
    """A request's expected cost of quotas in other units: ``Cost({"tokens": 1200})``."""

    def __init__(self, units: Optional[Mapping[str, int]] = None) -> None: ...
    def of(self, unit: str) -> int: ...

class Pacer:
    def __init__(self, reserve: int = 10, margin_percent: int = 5) -> None: ...
    def next_send_at(self, now_ms: int, cost: Optional[Cost] = None) -> Optional[int]: ...
    def on_send(self, now_ms: int, cost: Optional[Cost] = None) -> int: ...
    def on_failure(self, ticket: int) -> None: ...
    def observe(self, info: RateLimitInfo, now_ms: int, ticket: int) -> None: ...
    in_flight: int
    adapts: bool

class Rng:
    def __init__(self, seed: int) -> None: ...

class Backoff:
    def __init__(self, base_ms: int, cap_ms: int, max_retries: int, max_elapsed_ms: int, jitter: str) -> None: ...
    def next_delay(self, elapsed_ms: int, floor_ms: Optional[int], rng: Rng) -> Optional[int]: ...
    retries: int

class RetryBudget:
    def __init__(self, ratio: float, min_retries: int) -> None: ...
    def deposit(self) -> None: ...
    def try_withdraw(self) -> bool: ...
    available: int

def is_idempotent(method: str) -> bool: ...
def defaults() -> Dict[str, Dict[str, Any]]: ...

class Decision:
    allowed: bool
    limit: int
    remaining: int
    reset_after_ms: int
    retry_after_ms: int

class Limiter:
    """One limit of sluice-core, for servers and tests."""

    def __init__(self, algorithm: str, limit: int, window_ms: int, burst: int = 0) -> None: ...
    def decide(self, now_ms: int, cost: int = 1) -> Decision: ...
