"""Answers written out here as literal header lines, not formatted by sluice-core: what the
client reads from them, and how it paces and retries by them. Every time is compared with a
baseline of the same run."""

from concurrent.futures import ThreadPoolExecutor

import httpx

import sluice_client
from sluice_client import BackoffPolicy

X_SPENT = [["HTTP/1.1 200 OK", "X-RateLimit-Limit: 10", "X-RateLimit-Remaining: 0", "X-RateLimit-Reset: 1"]]
X_LEFT = [["HTTP/1.1 200 OK", "X-RateLimit-Limit: 10", "X-RateLimit-Remaining: 9", "X-RateLimit-Reset: 1"]]
IETF_SPENT = [["HTTP/1.1 200 OK", 'RateLimit-Policy: "p";q=10;w=1', 'RateLimit: "p";r=0;t=1']]
DENIED_FOR_1S = [["HTTP/1.1 429 Too Many Requests", "Retry-After: 1"], ["HTTP/1.1 200 OK"]]
DENIED_FOR_0S = [["HTTP/1.1 429 Too Many Requests", "Retry-After: 0"], ["HTTP/1.1 200 OK"]]


def two_requests(server):
    """Two GETs one after the other with a fresh client: the first one's quota, and the
    time between their arrivals at the server."""
    with httpx.Client(transport=sluice_client.Transport()) as client:
        first = client.get(server.url)
        second = client.get(server.url)
    assert (first.status_code, second.status_code) == (200, 200)
    return first.extensions["rate_limit"], server.gap_ms(0)


def in_parallel(*calls):
    with ThreadPoolExecutor(len(calls)) as pool:
        return [f.result() for f in [pool.submit(c) for c in calls]]


def test_a_literal_remaining_0_holds_the_next_request_until_the_literal_reset(scripted):
    spent, left = scripted(X_SPENT), scripted(X_LEFT)
    (s_quota, s_gap), (l_quota, l_gap) = in_parallel(lambda: two_requests(spent), lambda: two_requests(left))
    assert s_quota.to_dict() == {
        "limit": 10,
        "remaining": 0,
        "reset_after_ms": 1000,
        "retry_after_ms": None,
        "policy": None,
        "window_ms": None,
        "global": False,
        "partition": None,
        "quotas": [],
    }
    assert l_quota.remaining == 9
    print(f"next request after {s_gap:.1f} ms (remaining 0), {l_gap:.1f} ms (remaining 9)")
    assert s_gap >= 1000, f"sent {s_gap} ms after, before the reset"
    assert l_gap < s_gap / 2, f"with 9 left it waited {l_gap} ms too"


def test_literal_ietf_fields_let_the_next_request_go_after_one_refill(scripted):
    ietf, legacy = scripted(IETF_SPENT), scripted(X_SPENT)
    (i_quota, i_gap), (_, l_gap) = in_parallel(lambda: two_requests(ietf), lambda: two_requests(legacy))
    assert (i_quota.limit, i_quota.remaining, i_quota.policy, i_quota.window_ms) == (10, 0, "p", 1000)
    print(f"next request after {i_gap:.1f} ms (IETF, w=1 q=10), {l_gap:.1f} ms (X-RateLimit, no window)")
    # w / q = 100 ms refills one request; without a window only the reset (1 s) does.
    assert i_gap >= 100, f"sent {i_gap} ms after, before a refill"
    assert i_gap < l_gap / 2, f"{i_gap} ms: waited for the reset as if no window were known"


def test_a_literal_429_with_retry_after_1_is_retried_after_that_second(scripted):
    denied, baseline = scripted(DENIED_FOR_1S), scripted(DENIED_FOR_0S)

    def send(server):
        floors = []
        transport = sluice_client.Transport(backoff=BackoffPolicy(base_ms=1), on_retry=lambda e: floors.append(e.floor_ms))
        with httpx.Client(transport=transport) as client:
            response = client.get(server.url)
        assert (response.status_code, response.extensions["retries"]) == (200, 1)
        return floors

    floors, baseline_floors = in_parallel(lambda: send(denied), lambda: send(baseline))
    waited, baseline_waited = denied.gap_ms(0), baseline.gap_ms(0)
    print(f"retried after {waited:.1f} ms (Retry-After: 1), {baseline_waited:.1f} ms (Retry-After: 0)")
    assert waited >= 1000, f"retried {waited} ms after, before Retry-After"
    assert waited < baseline_waited + 2000, f"retried {waited} ms after, far beyond the 1 s asked"
    assert floors == [1000]
    assert baseline_floors == [0]


# Discord: routes /a and /b answer with their own bucket, then /a is refused, by the global
# limit or by a shared resource's limit, then /b is asked again.
DISCORD_A = ["HTTP/1.1 200 OK", "X-RateLimit-Limit: 5", "X-RateLimit-Remaining: 4", "X-RateLimit-Reset-After: 1", "X-RateLimit-Bucket: a"]
DISCORD_B = ["HTTP/1.1 200 OK", "X-RateLimit-Limit: 5", "X-RateLimit-Remaining: 4", "X-RateLimit-Reset-After: 1", "X-RateLimit-Bucket: b"]
DISCORD_GLOBAL = [
    DISCORD_A,
    DISCORD_B,
    ["HTTP/1.1 429 Too Many Requests", "Retry-After: 1", "X-RateLimit-Global: true", "X-RateLimit-Scope: global"],
    DISCORD_B,
]
DISCORD_SHARED = [
    DISCORD_A,
    DISCORD_B,
    [
        "HTTP/1.1 429 Too Many Requests",
        "Retry-After: 1",
        "X-RateLimit-Limit: 5",
        "X-RateLimit-Remaining: 0",
        "X-RateLimit-Reset-After: 1",
        "X-RateLimit-Bucket: a",
        "X-RateLimit-Scope: shared",
    ],
    DISCORD_B,
]


def test_a_discord_global_429_holds_every_route_of_the_host_a_shared_one_only_its_own(scripted):
    glob, shared = scripted(DISCORD_GLOBAL), scripted(DISCORD_SHARED)

    def other_route_after_a_429(server):
        statuses = []
        with httpx.Client(transport=sluice_client.Transport(retry_statuses=())) as client:
            for path in ("/a", "/b", "/a", "/b"):
                statuses.append(client.get(f"{server.url}{path}").status_code)
        return statuses, server.gap_ms(2)

    (g_statuses, g_gap), (s_statuses, s_gap) = in_parallel(lambda: other_route_after_a_429(glob), lambda: other_route_after_a_429(shared))
    assert g_statuses == s_statuses == [200, 200, 429, 200]
    print(f"/b after the 429 on /a: {g_gap:.1f} ms (global), {s_gap:.1f} ms (shared)")
    assert g_gap >= 1000, f"/b went {g_gap} ms after a global 429 with Retry-After: 1"
    assert s_gap < g_gap / 2, f"/b waited {s_gap} ms for a shared limit on /a's bucket"
