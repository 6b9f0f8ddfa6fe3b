"""A requests ``HTTPAdapter`` that paces, queues and retries by the rate limits servers
advertise: ``session.mount("https://", sluice_client.HTTPAdapter())``. The final response
carries its quota as ``response.rate_limit`` and its retries as ``response.retries``.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional, Tuple
from urllib.parse import urlsplit

import requests
import requests.adapters
from urllib3.exceptions import ConnectTimeoutError, NewConnectionError

from ._engine import IDEMPOTENCY_KEY, Call, Engine, cost_of
from ._drive import run_sync
from .errors import RetryExhausted
from .options import resolve

_DEFAULT_PORTS = {"http": 80, "https": 443}


def _read(response: requests.Response) -> Tuple[int, Iterable[Tuple[str, str]]]:
    # urllib3's headers keep repeated lines apart; requests' own join them.
    raw = getattr(response.raw, "headers", None)
    headers = raw if raw is not None and hasattr(raw, "items") else response.headers
    return response.status_code, list(headers.items())


def _is_connect(error: BaseException) -> bool:
    if isinstance(error, requests.exceptions.ConnectTimeout):
        return True
    if not isinstance(error, requests.exceptions.ConnectionError):
        return False
    reason = getattr(error.args[0], "reason", None) if error.args else None
    return isinstance(reason, (NewConnectionError, ConnectTimeoutError))


def _host_path(url: str) -> Tuple[str, str]:
    u = urlsplit(url)
    host = u.hostname or ""
    port = u.port or _DEFAULT_PORTS.get(u.scheme)
    return (f"{host}:{port}" if port else host), (u.path or "/")


class HTTPAdapter(requests.adapters.HTTPAdapter):
    """requests' adapter with Sluice's queues, pacing and retries. Options are the Rust
    SDK's (see ``sluice_client.options.resolve``); the keyword arguments of requests' own
    adapter (``pool_connections``, ``pool_maxsize``…) go in ``adapter_options``."""

    def __init__(self, adapter_options: Optional[dict] = None, **options: Any) -> None:
        self._engine = Engine(resolve(**options))
        super().__init__(**(adapter_options or {}))

    def send(self, request: requests.PreparedRequest, *args: Any, **kwargs: Any) -> requests.Response:  # type: ignore[override]
        o = self._engine.options
        host, path = _host_path(request.url or "")
        cost = o.cost(request) if o.cost is not None else None
        call = Call(
            method=request.method or "GET",
            host=host,
            path=path,
            idempotency_key=IDEMPOTENCY_KEY in request.headers,
            resendable=request.body is None or isinstance(request.body, (bytes, str)),
            cost=cost_of(cost),
            bucket=o.bucket(request) if o.bucket is not None else None,
            queue_timeout=o.queue_timeout,
            read=_read,
            is_connect=_is_connect,
        )
        outcome = run_sync(
            self._engine,
            call,
            lambda: super(HTTPAdapter, self).send(request, *args, **kwargs),
            lambda response: response.close(),
        )
        response: requests.Response = outcome.response
        response.rate_limit = outcome.rate_limit  # type: ignore[attr-defined]
        response.retries = outcome.retries  # type: ignore[attr-defined]
        if outcome.exhausted and o.raise_on_exhausted:
            _ = response.content  # read, so that the error holds the whole answer
            raise RetryExhausted(response, outcome.retries, response.status_code, outcome.rate_limit)
        return response

    def bucket_for(self, url: str) -> str:
        """The bucket a request to ``url`` joins now."""
        host, path = _host_path(url)
        with self._engine.lock:
            return self._engine.bucket_for(host, path)

    def queued(self, key: str) -> int:
        """Requests waiting in bucket ``key``'s queue (not those in flight)."""
        with self._engine.lock:
            return self._engine.queues.waiting(key)

    def retries_available(self) -> int:
        """Retries the budget allows right now."""
        return self._engine.budget.available
