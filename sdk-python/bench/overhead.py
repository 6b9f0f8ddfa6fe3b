"""The Python SDK's overhead per request against plain httpx (and requests), in one run.

Every answer carries IETF and X-RateLimit headers of a quota that never runs out, so the
SDK reads, paces and queues every request but never waits. Two settings:

* in memory: httpx's ``MockTransport`` answers, so the time is the client's own work and
  the difference is the SDK's alone (little noise);
* over loopback: a local keep-alive server answers (``ThreadingHTTPServer``), as a real
  call would, for httpx (sync and async) and requests.

One client of each kind sends requests one after the other; plain and Sluice take turns in
blocks, so that both see the same machine. Reported: the median over blocks of the time per
request of each, and the SDK's overhead (the difference).

    sdk-python/.venv/bin/python sdk-python/bench/overhead.py [--requests 500] [--rounds 20]

Build the extension in release first (`maturin develop --release`, or install the wheel).
"""

import argparse
import asyncio
import statistics
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import requests

import sluice_client

HEADERS = [
    ("RateLimit-Policy", '"bench";q=1000000000;w=1'),
    ("RateLimit", '"bench";r=999999999;t=1'),
    ("X-RateLimit-Limit", "1000000000"),
    ("X-RateLimit-Remaining", "999999999"),
    ("X-RateLimit-Reset", "1"),
]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go in two writes

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:
        self.send_response(200)
        for name, value in HEADERS:
            self.send_header(name, value)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")


def per_request_us(send, n: int) -> float:
    started = time.perf_counter()
    for _ in range(n):
        send()
    return (time.perf_counter() - started) / n * 1e6


async def per_request_us_async(client: httpx.AsyncClient, url: str, n: int) -> float:
    started = time.perf_counter()
    for _ in range(n):
        (await client.get(url)).raise_for_status()
    return (time.perf_counter() - started) / n * 1e6


def report(name: str, base: list, sdk: list) -> None:
    b, s = statistics.median(base), statistics.median(sdk)
    print(f"{name:<32} plain {b:7.1f} us   sluice {s:7.1f} us   overhead {s - b:+6.1f} us/request ({(s / b - 1) * 100:+.0f} %)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=500, help="requests per block")
    parser.add_argument("--rounds", type=int, default=20, help="blocks of each kind")
    args = parser.parse_args()
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/bench"
    n = args.requests

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers=HEADERS, content=b"ok")

    mock_plain = httpx.Client(transport=httpx.MockTransport(answer))
    mock_sdk = httpx.Client(transport=sluice_client.Transport(transport=httpx.MockTransport(answer)))
    base_m, sdk_m = [], []
    for _ in range(args.rounds):
        base_m.append(per_request_us(lambda: mock_plain.get(url).raise_for_status(), n))
        sdk_m.append(per_request_us(lambda: mock_sdk.get(url).raise_for_status(), n))
    report("in memory: httpx.Client", base_m, sdk_m)

    async def run_mock_async():
        async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as a, httpx.AsyncClient(
            transport=sluice_client.AsyncTransport(transport=httpx.MockTransport(answer))
        ) as b:
            base_a, sdk_a = [], []
            for _ in range(args.rounds):
                base_a.append(await per_request_us_async(a, url, n))
                sdk_a.append(await per_request_us_async(b, url, n))
        report("in memory: httpx.AsyncClient", base_a, sdk_a)

    asyncio.run(run_mock_async())

    plain, sdk = httpx.Client(), httpx.Client(transport=sluice_client.Transport())
    base_t, sdk_t = [], []
    for _ in range(args.rounds):
        base_t.append(per_request_us(lambda: plain.get(url).raise_for_status(), n))
        sdk_t.append(per_request_us(lambda: sdk.get(url).raise_for_status(), n))
    report("loopback: httpx.Client", base_t, sdk_t)

    async def run_async():
        async with httpx.AsyncClient() as a, httpx.AsyncClient(transport=sluice_client.AsyncTransport()) as b:
            base_a, sdk_a = [], []
            for _ in range(args.rounds):
                base_a.append(await per_request_us_async(a, url, n))
                sdk_a.append(await per_request_us_async(b, url, n))
        report("loopback: httpx.AsyncClient", base_a, sdk_a)

    asyncio.run(run_async())

    s_plain, s_sdk = requests.Session(), requests.Session()
    s_sdk.mount("http://", sluice_client.HTTPAdapter())
    base_r, sdk_r = [], []
    for _ in range(args.rounds):
        base_r.append(per_request_us(lambda: s_plain.get(url).raise_for_status(), n))
        sdk_r.append(per_request_us(lambda: s_sdk.get(url).raise_for_status(), n))
    report("loopback: requests.Session", base_r, sdk_r)

    # The SDK's own work without any I/O: parsing these headers once.
    parse_t = per_request_us(lambda: sluice_client.parse_headers(200, HEADERS), 100_000)
    print(f"{'parse_headers (5 lines)':<32} {parse_t:7.2f} us")
    server.shutdown()


if __name__ == "__main__":
    main()
