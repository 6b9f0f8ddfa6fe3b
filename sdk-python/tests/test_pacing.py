"""Pacing against a real local server that enforces its quota (servers.LimitedServer):
sync (httpx.Client from threads, requests from threads) and async (httpx.AsyncClient),
asserted against what the server admitted in the same run."""

import asyncio
from concurrent.futures import ThreadPoolExecutor

import httpx
import requests

import sluice_client

# The least share of the server's quota a paced client must use (server.admitted_ratio()).
MIN_RATIO = 0.9
REQUESTS = 60


def check_paced(server, statuses):
    ratio = server.admitted_ratio()
    print(f"admitted {ratio:.3f} of what the bucket allowed over the same span, {server.denials} refusals")
    assert server.hits == REQUESTS + server.denials - statuses.count(429)
    assert server.denials <= 1, f"{server.denials} refusals"
    assert ratio >= MIN_RATIO, f"used only {ratio:.3f} of the quota (at least {MIN_RATIO})"


def test_httpx_threads_use_the_quota_without_a_refusal(limited):
    server = limited(limit=20, burst=10)
    with httpx.Client(transport=sluice_client.Transport()) as client:
        with ThreadPoolExecutor(16) as pool:
            responses = list(pool.map(lambda _: client.get(f"{server.url}/limited"), range(REQUESTS)))
    statuses = [r.status_code for r in responses]
    assert set(statuses) == {200}
    for r in responses:
        assert r.extensions["rate_limit"].limit == 20, "the quota is read on every response"
        assert sluice_client.rate_limit(r) is r.extensions["rate_limit"]
    check_paced(server, statuses)


def test_async_httpx_uses_the_quota_without_a_refusal(limited):
    server = limited(limit=20, burst=10)

    async def main():
        async with httpx.AsyncClient(transport=sluice_client.AsyncTransport()) as client:
            return await asyncio.gather(*(client.get(f"{server.url}/limited") for _ in range(REQUESTS)))

    responses = asyncio.run(main())
    statuses = [r.status_code for r in responses]
    assert set(statuses) == {200}
    assert all(r.extensions["rate_limit"].policy == "test" for r in responses)
    check_paced(server, statuses)


def test_a_requests_session_uses_the_quota_without_a_refusal(limited):
    server = limited(limit=20, burst=10)
    session = requests.Session()
    session.mount("http://", sluice_client.HTTPAdapter(adapter_options={"pool_maxsize": 16}))
    with ThreadPoolExecutor(16) as pool:
        responses = list(pool.map(lambda _: session.get(f"{server.url}/limited"), range(REQUESTS)))
    statuses = [r.status_code for r in responses]
    assert set(statuses) == {200}
    assert all(r.rate_limit.remaining is not None and r.retries == 0 for r in responses)
    check_paced(server, statuses)


def test_without_pacing_the_same_load_is_refused(limited):
    # The baseline that shows the server enforces its quota in this run.
    server = limited(limit=20, burst=10)
    with httpx.Client(transport=sluice_client.Transport(pacing=False, retry_statuses=())) as client:
        with ThreadPoolExecutor(16) as pool:
            list(pool.map(lambda _: client.get(f"{server.url}/limited"), range(REQUESTS)))
    print(f"unpaced: {server.denials} refusals of {REQUESTS}")
    assert server.denials > 1, "the server refused no more than a paced client may see"


def test_a_route_joins_its_policy_bucket_once_a_response_names_it(limited):
    server = limited()
    transport = sluice_client.Transport()
    host = server.url.removeprefix("http://")
    url = f"{server.url}/limited?page=1"
    assert transport.bucket_for(url) == host
    with httpx.Client(transport=transport) as client:
        assert client.get(url).extensions["rate_limit"].policy == "test"
    assert transport.bucket_for(url) == f"{host} test"
    assert transport.bucket_for(f"{server.url}/gate") == host, "another route keeps the host bucket"
