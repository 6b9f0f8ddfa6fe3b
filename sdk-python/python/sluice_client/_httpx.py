"""httpx transports: ``Transport`` for ``httpx.Client``, ``AsyncTransport`` for
``httpx.AsyncClient``. Each wraps another transport (by default httpx's own) and sends
every request through its bucket's queue, with retries; the final response carries its
quota as ``response.extensions["rate_limit"]`` and its retries as
``response.extensions["retries"]``.

Per request, ``extensions={"sluice_cost": {"tokens": 1200}}`` gives the expected cost of
quotas counted in other units, ``"sluice_bucket"`` a bucket of the caller's own and
``"sluice_queue_timeout"`` the longest wait in the queue, in seconds.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional, Tuple

import httpx

from ._engine import IDEMPOTENCY_KEY, Call, Engine, Outcome, cost_of
from ._drive import run_async, run_sync
from .errors import RetryExhausted
from .options import resolve

_DEFAULT_PORTS = {"http": 80, "https": 443}


def _read(response: httpx.Response) -> Tuple[int, Iterable[Tuple[bytes, bytes]]]:
    return response.status_code, response.headers.raw


def _is_connect(error: BaseException) -> bool:
    return isinstance(error, (httpx.ConnectError, httpx.ConnectTimeout))


class _Base:
    def __init__(self, **options: Any) -> None:
        self._engine = Engine(resolve(**options))

    def _call(self, request: httpx.Request) -> Call:
        o = self._engine.options
        url = request.url
        port = url.port or _DEFAULT_PORTS.get(url.scheme)
        host = f"{url.host}:{port}" if port else url.host
        ext = request.extensions
        cost = ext.get("sluice_cost")
        if cost is None and o.cost is not None:
            cost = o.cost(request)
        bucket = ext.get("sluice_bucket")
        if bucket is None and o.bucket is not None:
            bucket = o.bucket(request)
        return Call(
            method=request.method,
            host=host,
            path=url.path,
            idempotency_key=IDEMPOTENCY_KEY in request.headers,
            resendable=isinstance(request.stream, httpx.ByteStream),
            cost=cost_of(cost),
            bucket=bucket,
            queue_timeout=ext.get("sluice_queue_timeout", o.queue_timeout),
            read=_read,
            is_connect=_is_connect,
        )

    def _finish(self, request: httpx.Request, outcome: Outcome) -> httpx.Response:
        response: httpx.Response = outcome.response
        response.extensions["rate_limit"] = outcome.rate_limit
        response.extensions["retries"] = outcome.retries
        return response

    def _exhausted(self, request: httpx.Request, outcome: Outcome) -> Optional[RetryExhausted]:
        if not (outcome.exhausted and self._engine.options.raise_on_exhausted):
            return None
        response: httpx.Response = outcome.response
        response.request = request
        return RetryExhausted(response, outcome.retries, response.status_code, outcome.rate_limit)

    # What the Rust SDK's Client tells of its state.

    def bucket_for(self, url: Any) -> str:
        """The bucket a request to ``url`` joins now (``"host:port"`` or
        ``"host:port policy"``)."""
        request = httpx.Request("GET", url)
        call = self._call(request)
        with self._engine.lock:
            return self._engine.bucket_for(call.host, call.path)

    def queued(self, key: str) -> int:
        """Requests waiting in bucket ``key``'s queue (not those in flight)."""
        with self._engine.lock:
            return self._engine.queues.waiting(key)

    def buckets(self) -> int:
        """Buckets held now (at most ``max_buckets`` while they are idle)."""
        with self._engine.lock:
            return len(self._engine.queues.buckets)

    def retries_available(self) -> int:
        """Retries the budget allows right now."""
        return self._engine.budget.available


class Transport(_Base, httpx.BaseTransport):
    """An ``httpx.Client`` transport that paces, queues and retries by the rate limits
    servers advertise: ``httpx.Client(transport=sluice_client.Transport())``. Options are
    the Rust SDK's (see ``sluice_client.options.resolve``); ``transport`` is the transport
    that sends (default ``httpx.HTTPTransport()``)."""

    def __init__(self, transport: Optional[httpx.BaseTransport] = None, **options: Any) -> None:
        super().__init__(**options)
        self._inner = transport if transport is not None else httpx.HTTPTransport()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        outcome = run_sync(
            self._engine,
            self._call(request),
            lambda: self._inner.handle_request(request),
            lambda response: response.close(),
        )
        error = self._exhausted(request, outcome)
        if error is not None:
            outcome.response.read()
            outcome.response.close()
            raise error
        return self._finish(request, outcome)

    def close(self) -> None:
        self._inner.close()


class AsyncTransport(_Base, httpx.AsyncBaseTransport):
    """The same for ``httpx.AsyncClient``: ``httpx.AsyncClient(transport=
    sluice_client.AsyncTransport())``. A cancelled task (``asyncio.timeout``,
    ``wait_for``) leaves its queue at once."""

    def __init__(self, transport: Optional[httpx.AsyncBaseTransport] = None, **options: Any) -> None:
        super().__init__(**options)
        self._inner = transport if transport is not None else httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        async def discard(response: httpx.Response) -> None:
            await response.aclose()

        outcome = await run_async(
            self._engine,
            self._call(request),
            lambda: self._inner.handle_async_request(request),
            discard,
        )
        error = self._exhausted(request, outcome)
        if error is not None:
            await outcome.response.aread()
            await outcome.response.aclose()
            raise error
        return self._finish(request, outcome)

    async def aclose(self) -> None:
        await self._inner.aclose()
