"""Rate-limited servers built with Python's popular libraries, as their users write them.

Run as ``python real_servers.py KIND LIMIT WINDOW_S`` with the dev venv's Python (where
``scripts/setup`` installed the libraries of requirements-dev.txt). It serves on a free
loopback port and prints ``{"port": N}`` as its first line once it accepts connections.
``GET /`` is limited to LIMIT requests per WINDOW_S seconds per client address by the
library named; ``GET /stats`` (never limited) gives what the server answered so far,
``{"200": n, "429": m}``, counted after the library decided. It runs until its standard
input closes, so it never outlives the test that started it.

Kinds:

- ``slowapi``: slowapi (Starlette) over ``limits``' fixed window in memory, under uvicorn;
  sends ``X-RateLimit-Limit``, ``-Remaining`` and ``-Reset`` (a fractional epoch).
- ``flask-limiter``: Flask-Limiter over ``limits``' fixed window in memory, under werkzeug's
  threaded server; ``X-RateLimit-Reset`` an integer epoch.
- ``flask-limiter-moving``: the same with ``limits``' moving window (not in
  vectors/servers.json: the SDKs do not reach its rate yet, docs/sdks.md).

The SDKs' tests run every kind listed in vectors/servers.json.
"""

from __future__ import annotations

import json
import logging
import socket
import sys
import threading
from collections import Counter


def main() -> None:
    kind, limit, window = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    rule = f"{limit} per {window} second"
    counts: Counter = Counter()
    lock = threading.Lock()

    def count(status: int) -> None:
        with lock:
            counts[str(status)] += 1

    def stats() -> str:
        with lock:
            return json.dumps(dict(counts))

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(256)
    port = sock.getsockname()[1]

    if kind == "slowapi":
        serve = slowapi_server(rule, count, stats, sock)
    elif kind in ("flask-limiter", "flask-limiter-moving"):
        strategy = "moving-window" if kind.endswith("moving") else "fixed-window"
        serve = flask_server(rule, strategy, count, stats, sock)
    else:
        raise SystemExit(f"unknown kind {kind!r}")

    threading.Thread(target=serve, daemon=True).start()
    print(json.dumps({"port": port}), flush=True)
    sys.stdin.read()  # until the test closes it


def slowapi_server(rule, count, stats, sock):
    import uvicorn
    from slowapi import Limiter, _rate_limit_exceeded_handler
    from slowapi.errors import RateLimitExceeded
    from slowapi.util import get_remote_address
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    limiter = Limiter(key_func=get_remote_address, headers_enabled=True)

    @limiter.limit(rule)
    async def hello(request: Request) -> PlainTextResponse:
        return PlainTextResponse("hello")

    async def show(request: Request) -> PlainTextResponse:
        return PlainTextResponse(stats())

    app = Starlette(routes=[Route("/", hello), Route("/stats", show)])
    app.state.limiter = limiter
    app.add_exception_handler(RateLimitExceeded, _rate_limit_exceeded_handler)

    async def counted(scope, receive, send):
        async def sending(message):
            if message["type"] == "http.response.start" and scope["path"] == "/":
                count(message["status"])
            await send(message)

        await app(scope, receive, sending)

    config = uvicorn.Config(counted, log_level="warning", access_log=False)
    server = uvicorn.Server(config)
    return lambda: server.run(sockets=[sock])


def flask_server(rule, strategy, count, stats, sock):
    from flask import Flask, request
    from flask_limiter import Limiter
    from flask_limiter.util import get_remote_address
    from werkzeug.serving import make_server

    app = Flask("limited")
    limiter = Limiter(get_remote_address, app=app, headers_enabled=True, strategy=strategy, storage_uri="memory://")

    @app.get("/")
    @limiter.limit(rule)
    def hello():
        return "hello"

    @app.get("/stats")
    @limiter.exempt
    def show():
        return stats()

    @app.after_request
    def counted(response):
        if request.path == "/":
            count(response.status_code)
        return response

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line a request
    server = make_server("127.0.0.1", 0, app, threaded=True, fd=sock.fileno())
    return server.serve_forever


if __name__ == "__main__":
    main()
