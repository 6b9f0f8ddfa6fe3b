"""The errors a Sluice transport raises, besides the HTTP library's own."""

from __future__ import annotations

from typing import Any, Optional


class SluiceError(Exception):
    """Base class of the errors raised by Sluice itself."""


class QueueFull(SluiceError):
    """The bucket's queue already holds ``capacity`` waiting requests: the request was not
    queued (fail fast rather than wait behind an unbounded backlog)."""

    def __init__(self, key: str, capacity: int) -> None:
        super().__init__(f"queue for bucket {key!r} is full ({capacity} requests waiting)")
        self.key = key
        self.capacity = capacity


class QueueTimeout(SluiceError, TimeoutError):
    """The request waited ``timeout`` seconds in its bucket's queue without its turn
    coming; it left the queue."""

    def __init__(self, key: str, timeout: float) -> None:
        super().__init__(f"waited {timeout:g} s in the queue of bucket {key!r}")
        self.key = key
        self.timeout = timeout


class RetryExhausted(SluiceError):
    """The last answer was still a retried status (429, 503 by default) and the backoff
    schedule or the retry budget allowed no further retry. ``response`` is that last
    response, its body read; ``retries`` how many retries were taken before it."""

    def __init__(self, response: Any, retries: int, status: int, rate_limit: Optional[Any]) -> None:
        super().__init__(f"status {status} after {retries} retries; no retry left")
        self.response = response
        self.retries = retries
        self.status = status
        self.rate_limit = rate_limit
