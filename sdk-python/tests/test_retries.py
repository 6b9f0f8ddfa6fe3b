"""Retries: Retry-After honoured, idempotency, connection errors, the budget, the
retry-exhausted error and the on_retry hook; sync and async, httpx and requests."""

import asyncio

import httpx
import pytest
import requests

import sluice_client
from servers import free_port
from sluice_client import BackoffPolicy, BudgetConfig, RetryExhausted

FAST = BackoffPolicy(base_ms=1)


def waited_ms(server):
    return server.log[1][0] - server.log[0][0]


def test_a_429_with_retry_after_1_is_retried_no_earlier_than_1_s_later(limited):
    server = limited(deny_first=1)
    events = []
    with httpx.Client(transport=sluice_client.Transport(on_retry=events.append)) as client:
        response = client.get(f"{server.url}/deny-first")
    assert (response.status_code, response.extensions["retries"]) == (200, 1)
    assert [s for _, s, _ in server.log] == [429, 200]
    assert waited_ms(server) >= 1000, f"retried after {waited_ms(server)} ms"
    [event] = events
    assert (event.retry, event.status, event.floor_ms) == (1, 429, 1000)
    assert event.delay_ms >= 1000
    assert event.key == server.url.removeprefix("http://"), "the bucket of the refused attempt"


def test_async_retries_honour_retry_after_too(limited):
    server = limited(deny_first=1)

    async def main():
        async with httpx.AsyncClient(transport=sluice_client.AsyncTransport(backoff=FAST)) as client:
            return await client.get(f"{server.url}/deny-first")

    response = asyncio.run(main())
    assert (response.status_code, response.extensions["retries"]) == (200, 1)
    assert waited_ms(server) >= 1000, f"retried after {waited_ms(server)} ms"


def test_requests_retries_honour_retry_after(limited):
    server = limited(deny_first=1)
    session = requests.Session()
    session.mount("http://", sluice_client.HTTPAdapter(backoff=FAST))
    response = session.get(f"{server.url}/deny-first")
    assert (response.status_code, response.retries) == (200, 1)
    assert waited_ms(server) >= 1000, f"retried after {waited_ms(server)} ms"


def test_a_post_without_an_idempotency_key_is_not_retried(limited):
    server = limited(deny_first=1)
    with httpx.Client(transport=sluice_client.Transport()) as client:
        response = client.post(f"{server.url}/deny-first", content=b"payload")
    assert (response.status_code, response.extensions["retries"]) == (429, 0)
    assert response.extensions["rate_limit"].retry_after_ms == 1000
    assert server.hits == 1


def test_a_post_with_an_idempotency_key_is_retried_body_and_all(limited):
    server = limited(deny_first=1)
    with httpx.Client(transport=sluice_client.Transport(backoff=FAST)) as client:
        response = client.post(f"{server.url}/deny-first", content=b"payload", headers={"Idempotency-Key": "order-42"})
    assert (response.status_code, response.extensions["retries"]) == (200, 1)
    assert server.hits == 2


def test_no_retry_left_raises_retry_exhausted_with_the_last_response(limited):
    server = limited(deny_first=10)
    backoff = BackoffPolicy(base_ms=1, max_retries=1)
    with httpx.Client(transport=sluice_client.Transport(backoff=backoff)) as client:
        with pytest.raises(RetryExhausted) as caught:
            client.get(f"{server.url}/deny-first")
    e = caught.value
    assert (e.status, e.retries, e.response.status_code) == (429, 1, 429)
    assert e.response.text == "slow down", "the body was read"
    assert e.rate_limit.retry_after_ms == 1000
    assert server.hits == 2

    session = requests.Session()
    session.mount("http://", sluice_client.HTTPAdapter(backoff=BackoffPolicy(max_retries=0)))
    with pytest.raises(RetryExhausted) as caught:
        session.get(f"{server.url}/deny-first")
    assert caught.value.response.text == "slow down"
    # Turned off, the last response is returned as it is.
    session.mount("http://", sluice_client.HTTPAdapter(backoff=BackoffPolicy(max_retries=0), raise_on_exhausted=False))
    assert session.get(f"{server.url}/deny-first").status_code == 429


def test_the_retry_budget_stops_retries_when_spent(limited):
    server = limited(deny_first=10)
    transport = sluice_client.Transport(
        retry_budget=BudgetConfig(ratio=0, min_retries=1), backoff=FAST, raise_on_exhausted=False
    )
    assert transport.retries_available() == 1
    with httpx.Client(transport=transport) as client:
        first = client.get(f"{server.url}/deny-first")
        assert first.extensions["retries"] == 1, "the one retry the budget holds"
        second = client.get(f"{server.url}/deny-first")
    assert (second.status_code, second.extensions["retries"]) == (429, 0)
    assert server.hits == 3


def test_a_silent_servers_refusals_queue_again_without_the_retry_budget(limited):
    """A server that says nothing of its quota: its refusals teach the bucket's pacer its
    rate, and a refused request goes back to the queue, so the retry budget, here none at
    all, is not what ends it (issue 66). ``on_retry`` hears each one, with no delay."""
    server = limited(limit=5, burst=5)
    requeued = []
    transport = sluice_client.AsyncTransport(
        retry_budget=BudgetConfig(ratio=0, min_retries=0), on_retry=lambda e: requeued.append(e.delay_ms)
    )

    async def main():
        async with httpx.AsyncClient(transport=transport, timeout=30) as client:
            return await asyncio.gather(*(client.get(f"{server.url}/silent") for _ in range(20)))

    answers = asyncio.run(main())
    assert [r.status_code for r in answers] == [200] * 20
    assert server.denials > 0, "the server refused some: the path was taken"
    assert len(requeued) == server.denials, "each refusal queued again"
    assert all(d == 0 for d in requeued), requeued
    assert transport.retries_available() == 0


@pytest.mark.parametrize("retry, expected", [(True, 2), (False, 0)])
def test_connection_errors_are_retried_only_when_configured(retry, expected):
    url = f"http://127.0.0.1:{free_port()}/"
    events = []
    options = dict(backoff=BackoffPolicy(base_ms=1, max_retries=2), retry_connection_errors=retry, on_retry=events.append)
    with httpx.Client(transport=sluice_client.Transport(**options)) as client:
        with pytest.raises(httpx.ConnectError):
            client.get(url)
    assert len(events) == expected
    assert all(e.status is None and isinstance(e.error, httpx.ConnectError) for e in events)
    events.clear()
    session = requests.Session()
    session.mount("http://", sluice_client.HTTPAdapter(**options))
    with pytest.raises(requests.ConnectionError):
        session.get(url)
    assert len(events) == expected


def test_bad_options_are_refused_with_a_message_naming_them():
    with pytest.raises(TypeError, match="retries"):
        sluice_client.Transport(retries=3)
    with pytest.raises(ValueError, match="backoff.base_ms"):
        BackoffPolicy(base_ms=-1)
    with pytest.raises(ValueError, match="backoff.jitter"):
        BackoffPolicy(jitter="equal")
    with pytest.raises(ValueError, match="queue.capacity"):
        sluice_client.Transport(queue_capacity=-1)
    with pytest.raises(ValueError, match="retry_statuses"):
        sluice_client.Transport(retry_statuses=[999])
