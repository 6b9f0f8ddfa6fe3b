"""sluice-client: httpx and requests transports that respect the rate limits servers
advertise.

* Every response's rate-limit headers (``X-RateLimit-*``, IETF ``RateLimit`` /
  ``RateLimit-Policy``, ``Retry-After``, and the variants real APIs send) are read into a
  :class:`RateLimitInfo`: ``response.extensions["rate_limit"]`` (httpx),
  ``response.rate_limit`` (requests), or :func:`rate_limit` for either.
* Requests of one bucket wait in a bounded FIFO released at the pace that keeps them within
  the advertised quota (and within token quotas, at a request's expected :class:`Cost`);
  a full queue raises :class:`QueueFull` at once.
* 429, 503 and connection failures are retried with jittered exponential backoff, never
  earlier than ``Retry-After``, for idempotent requests or those with an
  ``Idempotency-Key``, while the retry budget lasts; a retried status with no retry left
  raises :class:`RetryExhausted` holding the last response.

Every decision is sluice-core's (the Rust crate, through PyO3), as in the Rust and
JavaScript SDKs; this package only queues, sleeps and sends.

    import httpx, sluice_client
    with httpx.Client(transport=sluice_client.Transport()) as client:
        response = client.get("http://127.0.0.1:8080/api/hello")
        print(response.extensions["rate_limit"].remaining)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from ._core import Cost, Limiter, RateLimitInfo, UnitQuota, is_idempotent, parse_headers
from .errors import QueueFull, QueueTimeout, RetryExhausted, SluiceError
from .options import BackoffPolicy, BudgetConfig, PacerConfig, QueueConfig, RetryEvent

if TYPE_CHECKING:
    from ._httpx import AsyncTransport, Transport
    from ._requests import HTTPAdapter

__all__ = [
    "AsyncTransport",
    "BackoffPolicy",
    "BudgetConfig",
    "Cost",
    "HTTPAdapter",
    "Limiter",
    "PacerConfig",
    "QueueConfig",
    "QueueFull",
    "QueueTimeout",
    "RateLimitInfo",
    "RetryEvent",
    "RetryExhausted",
    "SluiceError",
    "Transport",
    "UnitQuota",
    "is_idempotent",
    "parse_headers",
    "rate_limit",
]


def rate_limit(response: Any) -> Optional[RateLimitInfo]:
    """The quota a response of a Sluice transport advertised (httpx or requests)."""
    extensions = getattr(response, "extensions", None)
    if isinstance(extensions, dict) and "rate_limit" in extensions:
        return extensions["rate_limit"]
    return getattr(response, "rate_limit", None)


def __getattr__(name: str) -> Any:
    # httpx and requests are each optional: imported when their transport is asked for.
    if name in ("Transport", "AsyncTransport"):
        from . import _httpx

        return getattr(_httpx, name)
    if name == "HTTPAdapter":
        from ._requests import HTTPAdapter

        return HTTPAdapter
    raise AttributeError(f"module 'sluice_client' has no attribute {name!r}")
