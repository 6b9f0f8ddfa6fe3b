"""The queue: a full one fails fast; a request that times out or is cancelled leaves it at
once, and nothing stays queued; idle buckets are forgotten."""

import asyncio
import threading

import httpx
import pytest

import sluice_client
from servers import eventually
from sluice_client import QueueFull, QueueTimeout


def test_a_full_queue_fails_fast_and_a_timed_out_waiter_leaves_it(limited):
    server = limited()
    transport = sluice_client.Transport(max_in_flight=1, queue_capacity=2)
    url = f"{server.url}/gate"
    key = transport.bucket_for(url)
    results = {}
    with httpx.Client(transport=transport, timeout=30) as client:

        def get(name, **kwargs):
            try:
                results[name] = client.get(url, **kwargs).status_code
            except Exception as e:  # recorded for the assertions below
                results[name] = e

        threads = [threading.Thread(target=get, args=("first",))]
        threads[0].start()
        eventually("the first request reaches the server", lambda: server.gated == 1)
        threads.append(threading.Thread(target=get, args=("second",)))
        threads.append(threading.Thread(target=get, args=("third",), kwargs={"extensions": {"sluice_queue_timeout": 0.3}}))
        for t in threads[1:]:
            t.start()
        eventually("two requests wait", lambda: transport.queued(key) == 2)
        with pytest.raises(QueueFull) as full:
            client.get(url)
        assert (full.value.key, full.value.capacity) == (key, 2)

        threads[2].join(timeout=5)
        assert isinstance(results["third"], QueueTimeout)
        assert transport.queued(key) == 1, "the timed-out request left the queue"
        server.release()
        for t in threads:
            t.join(timeout=10)
    assert results["first"] == results["second"] == 200
    assert transport.queued(key) == 0
    assert server.hits == 2


def test_a_cancelled_task_leaves_the_queue_at_once(limited):
    server = limited()
    transport = sluice_client.AsyncTransport(max_in_flight=1)
    url = f"{server.url}/gate"
    key = transport.bucket_for(url)

    async def main():
        async with httpx.AsyncClient(transport=transport, timeout=30) as client:
            first = asyncio.ensure_future(client.get(url))
            while server.gated < 1:
                await asyncio.sleep(0.01)
            waiting = [asyncio.ensure_future(client.get(url)) for _ in range(3)]
            while transport.queued(key) < 3:
                await asyncio.sleep(0.01)
            waiting[1].cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting[1]
            assert transport.queued(key) == 2, "the cancelled request left the queue"
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(waiting[2], 0.2)
            assert transport.queued(key) == 1, "the timed-out request left the queue"
            server.release()
            return [r.status_code for r in await asyncio.gather(first, waiting[0])]

    assert asyncio.run(main()) == [200, 200]
    assert transport.queued(key) == 0
    assert server.hits == 2, "the cancelled requests were never sent"


def test_a_request_cancelled_in_flight_gives_its_turn_back(limited):
    server = limited()
    transport = sluice_client.AsyncTransport(max_in_flight=1)
    url = f"{server.url}/gate"

    async def main():
        async with httpx.AsyncClient(transport=transport, timeout=30) as client:
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(client.get(url), 0.3)
            server.release()
            # The next one is not held behind the cancelled one's in-flight slot.
            return (await asyncio.wait_for(client.get(f"{server.url}/limited"), 5)).status_code

    assert asyncio.run(main()) == 200


def test_idle_buckets_are_forgotten_past_max_buckets(limited):
    server = limited(limit=1000, burst=1000)
    key = ["a"]
    transport = sluice_client.Transport(queue=sluice_client.QueueConfig(max_buckets=4), bucket=lambda request: key[0])
    with httpx.Client(transport=transport) as client:
        for i in range(20):
            key[0] = f"route-{i}"
            assert client.get(f"{server.url}/limited").status_code == 200
            assert transport.buckets() <= 4
