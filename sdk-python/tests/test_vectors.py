"""Every case of the shared header vectors (vectors/headers.json, also read by sluice-core's
and the JavaScript SDK's tests) through the Python API, and the parser's robustness."""

import json
import random
from pathlib import Path

import pytest

import sluice_client
from sluice_client import RateLimitInfo, parse_headers

VECTORS = Path(__file__).resolve().parents[2] / "vectors" / "headers.json"


def close(got, want):
    if want is None:
        return got is None
    if isinstance(want, str):
        return got == want
    return got is not None and abs(got - want) <= 1


def quotas_match(got, want):
    return len(got) == len(want) and all(
        any(
            g.unit == w["unit"]
            and close(g.limit, w.get("limit"))
            and close(g.remaining, w.get("remaining"))
            and close(g.reset_after_ms, w.get("reset_after_ms"))
            and close(g.window_ms, w.get("window_ms"))
            and close(g.policy, w.get("policy"))
            for g in got
        )
        for w in want
    )


def test_every_shared_header_vector_parses_as_expected():
    v = json.loads(VECTORS.read_text())
    now_ms = v["now"] * 1000
    assert len(v["cases"]) >= 20
    failures = []
    for c in v["cases"]:
        got = parse_headers(c.get("status", 200), [tuple(h) for h in c["headers"]], now_ms)
        e = c["expect"]
        ok = (
            close(got.limit, e.get("limit"))
            and close(got.remaining, e.get("remaining"))
            and close(got.reset_after_ms, e.get("reset_after_ms"))
            and close(got.retry_after_ms, e.get("retry_after_ms"))
            and close(got.window_ms, e.get("window_ms"))
            and close(got.policy, e.get("policy"))
            and close(got.partition, e.get("partition"))
            and got.global_ == e.get("global", False)
            and quotas_match(got.quotas, e.get("quotas", []))
        )
        if not ok:
            failures.append(f"{c['name']}: got {got.to_dict()}, want {e}")
    assert failures == []


def test_headers_come_as_pairs_bytes_or_a_mapping_alike():
    pairs = [("RateLimit", '"api";r=4;t=30'), ("RateLimit-Policy", '"api";q=10;w=60')]
    want = {
        "limit": 10,
        "remaining": 4,
        "reset_after_ms": 30000,
        "retry_after_ms": None,
        "policy": "api",
        "window_ms": 60000,
        "global": False,
        "partition": None,
        "quotas": [],
    }
    assert parse_headers(200, pairs).to_dict() == want
    assert parse_headers(200, [(n.encode(), v.encode()) for n, v in pairs]).to_dict() == want
    assert parse_headers(200, dict(pairs)).to_dict() == want
    assert parse_headers(200, [list(p) for p in pairs]) == parse_headers(200, pairs)
    with pytest.raises(TypeError):
        parse_headers(200, [("RateLimit",)])
    with pytest.raises(TypeError):
        parse_headers(200, [(1, 2)])


def test_token_quotas_come_with_the_requests_quota():
    # OpenAI's headers (platform.openai.com/docs/guides/rate-limits), as sent.
    q = parse_headers(
        200,
        [
            ("x-ratelimit-limit-requests", "60"),
            ("x-ratelimit-limit-tokens", "150000"),
            ("x-ratelimit-remaining-requests", "59"),
            ("x-ratelimit-remaining-tokens", "149984"),
            ("x-ratelimit-reset-requests", "1s"),
            ("x-ratelimit-reset-tokens", "6m0s"),
        ],
    )
    assert (q.limit, q.remaining, q.reset_after_ms) == (60, 59, 1000)
    tokens = q.quota("tokens")
    assert tokens is not None
    assert (tokens.limit, tokens.remaining, tokens.reset_after_ms) == (150000, 149984, 360000)
    assert [u.unit for u in q.quotas] == ["tokens"]
    assert q.quota("bytes") is None
    assert sluice_client.Cost({"tokens": 1200}).of("tokens") == 1200
    assert sluice_client.Cost({"tokens": 1200}).of("requests") == 1


def test_the_parser_never_raises_on_random_input():
    rng = random.Random(0x2545F491)
    alphabet = ' ",;=:-/0123456789abcdefgrtwqRLX\u00e9\x00\t\U0001F600'
    names = ["RateLimit", "RateLimit-Policy", "Retry-After", "X-RateLimit-Limit", "X-RateLimit-Remaining", "X-RateLimit-Reset", "x-other"]
    for _ in range(3000):
        headers = [
            (rng.choice(names), "".join(rng.choice(alphabet) for _ in range(rng.randrange(40))))
            for _ in range(rng.randrange(5))
        ]
        q = parse_headers(rng.randrange(100, 600), headers, rng.randrange(2**42))
        assert isinstance(q, RateLimitInfo)
        for k in ("limit", "remaining", "reset_after_ms", "retry_after_ms", "window_ms"):
            v = getattr(q, k)
            assert v is None or v >= 0
