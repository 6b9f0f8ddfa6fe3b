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
- ``slowapi-silent``, ``flask-limiter-silent``: each with its headers off (the libraries'
  default): a 429 and nothing else.
- ``drf``: Django REST framework's ``AnonRateThrottle`` (a log of each client's requests in
  Django's local-memory cache) under Django's WSGI handler and werkzeug's threaded server;
  sends only ``Retry-After`` on a 429, whole seconds rounded up.

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

    silent = kind.endswith("-silent")
    if kind in ("slowapi", "slowapi-silent"):
        serve = slowapi_server(rule, not silent, count, stats, sock)
    elif kind in ("flask-limiter", "flask-limiter-moving", "flask-limiter-silent"):
        strategy = "moving-window" if kind.endswith("moving") else "fixed-window"
        serve = flask_server(rule, strategy, not silent, count, stats, sock)
    elif kind == "drf":
        serve = drf_server(limit, window, count, stats, sock)
    else:
        raise SystemExit(f"unknown kind {kind!r}")

    threading.Thread(target=serve, daemon=True).start()
    print(json.dumps({"port": port}), flush=True)
    sys.stdin.read()  # until the test closes it


def slowapi_server(rule, headers, count, stats, sock):
    import uvicorn
    from slowapi import Limiter, _rate_limit_exceeded_handler
    from slowapi.errors import RateLimitExceeded
    from slowapi.util import get_remote_address
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    limiter = Limiter(key_func=get_remote_address, headers_enabled=headers)

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


def flask_server(rule, strategy, headers, count, stats, sock):
    from flask import Flask, request
    from flask_limiter import Limiter
    from flask_limiter.util import get_remote_address
    from werkzeug.serving import make_server

    app = Flask("limited")
    limiter = Limiter(get_remote_address, app=app, headers_enabled=headers, strategy=strategy, storage_uri="memory://")

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


def drf_server(limit, window, count, stats, sock):
    import django
    from django.conf import settings

    period = {1: "second", 60: "minute", 3600: "hour", 86400: "day"}.get(window)
    if period is None:
        raise SystemExit(f"Django REST framework's rates have no window of {window} s")
    settings.configure(
        DEBUG=False,
        ALLOWED_HOSTS=["127.0.0.1"],
        ROOT_URLCONF=__name__,
        SECRET_KEY="sluice-tests",
        INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth", "rest_framework"],
        CACHES={"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}},
        REST_FRAMEWORK={
            "DEFAULT_THROTTLE_CLASSES": ["rest_framework.throttling.AnonRateThrottle"],
            "DEFAULT_THROTTLE_RATES": {"anon": f"{limit}/{period}"},
            "UNAUTHENTICATED_USER": None,
        },
    )
    django.setup()
    from django.core.wsgi import get_wsgi_application
    from django.http import HttpResponse
    from django.urls import path
    from rest_framework.decorators import api_view, throttle_classes
    from rest_framework.response import Response
    from werkzeug.serving import make_server

    @api_view(["GET"])
    def hello(request):
        return Response("hello")

    @api_view(["GET"])
    @throttle_classes([])
    def show(request):
        return HttpResponse(stats(), content_type="application/json")

    global urlpatterns
    urlpatterns = [path("", hello), path("stats", show)]
    django_app = get_wsgi_application()

    def counted(environ, start_response):
        def starting(status, headers, exc_info=None):
            if environ.get("PATH_INFO") == "/":
                count(int(status.split()[0]))
            return start_response(status, headers, exc_info)

        return django_app(environ, starting)

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = make_server("127.0.0.1", 0, counted, threaded=True, fd=sock.fileno())
    return server.serve_forever


if __name__ == "__main__":
    main()
