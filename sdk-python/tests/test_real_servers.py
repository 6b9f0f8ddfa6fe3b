"""Pacing against servers we did not write: every server of vectors/servers.json (slowapi,
Flask-Limiter, express-rate-limit in each header mode, @fastify/rate-limit; and those that
advertise no quota: Django REST framework, slowapi, Flask-Limiter and express-rate-limit with
their headers off), started from the libraries scripts/setup installed, each sent many
requests at once through the httpx transport. The server's own counts say how many it
refused."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import urllib.request

import httpx
import pytest

import sluice_client

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
with open(os.path.join(ROOT, "vectors", "servers.json"), encoding="utf-8") as f:
    SPEC = json.load(f)


class RealServer:
    """One server of vectors/servers.json in a process of its own, stopped by closing its
    standard input."""

    def __init__(self, entry: dict) -> None:
        args = [entry["kind"], str(SPEC["limit"]), str(SPEC["window_s"])]
        if entry["runtime"] == "python":
            command = [sys.executable, os.path.join(ROOT, "sdk-python", "tests", "real_servers.py"), *args]
        else:
            command = ["node", os.path.join(ROOT, "sdk-js", "test", "real-servers.mjs"), *args]
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert line, f"{entry['kind']} did not start (exit {self.process.wait()})"
        self.url = f"http://127.0.0.1:{json.loads(line)['port']}"

    def stats(self) -> dict:
        with urllib.request.urlopen(f"{self.url}/stats", timeout=10) as r:
            return json.loads(r.read())

    def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def measure(server: RealServer) -> tuple[list[int], float]:
    """The statuses of SPEC["requests"] GETs sent at once, and the span from the first send
    to the last answer, in seconds."""

    async def main() -> tuple[list[int], float]:
        transport = sluice_client.AsyncTransport()
        async with httpx.AsyncClient(transport=transport, timeout=60) as client:
            started = time.monotonic()
            responses = await asyncio.gather(*(client.get(f"{server.url}/") for _ in range(SPEC["requests"])))
            return [r.status_code for r in responses], time.monotonic() - started

    return asyncio.run(main())


#: Each server with the bounds it is held to: those that advertise their quota, then the
#: silent ones.
CASES = [(entry, SPEC) for entry in SPEC["servers"]] + [(entry, SPEC["silent"]) for entry in SPEC["silent"]["servers"]]


@pytest.mark.parametrize("entry,bounds", CASES, ids=[entry["kind"] for entry, _ in CASES])
def test_every_request_ends_200_at_the_rate_the_server_allows(entry, bounds):
    server = RealServer(entry)
    try:
        statuses, span = measure(server)
        seen = server.stats()
    finally:
        server.close()
    limit, window = SPEC["limit"], SPEC["window_s"]
    ok, refused = seen.get("200", 0), seen.get("429", 0)
    # The 200s over the span from the first send to the last answer, against limit / window.
    ratio = ok / span / (limit / window)
    print(f"{entry['kind']}: {ok} × 200, {refused} × 429 in {span:.2f} s: {ratio:.2f} of the allowed rate")
    assert statuses == [200] * SPEC["requests"]
    assert ok == SPEC["requests"], seen
    assert refused <= bounds["max_refused"] * (ok + refused), f"{refused} refused of {ok + refused}"
    assert span >= 5 * window, "the workload spans at least 5 windows"
    assert ratio >= bounds["min_ratio"], f"{ratio:.2f} of the allowed rate (at least {bounds['min_ratio']})"
