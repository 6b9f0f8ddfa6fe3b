"""Sluice's Python SDK against the demo stack (`bash scripts/demo`: the harness proxy on
localhost:8080, whose per-IP rule admits 5 requests per 10 s).

Eight GETs through one httpx client: the transport reads each answer's quota, sends the
first five at once and spaces the rest at the rule's refill (one per 2 s), so the server
refuses none. Run with the SDK installed (`pip install ./sdk-python httpx`):

    python examples/python/quickstart.py [URL]
"""

import sys
import time

import httpx

import sluice_client

URL = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8080/api/hello"


def main() -> None:
    transport = sluice_client.Transport(
        backoff=sluice_client.BackoffPolicy(max_retries=3),  # never before Retry-After
        queue_capacity=100,
        on_retry=lambda e: print(f"  retry {e.retry} of {e.key} in {e.delay_ms} ms (status {e.status})"),
    )
    started = time.monotonic()
    with httpx.Client(transport=transport, timeout=30) as client:
        for i in range(8):
            response = client.get(URL)
            quota = response.extensions["rate_limit"]
            print(
                f"{time.monotonic() - started:5.1f} s  {response.status_code}  "
                f"{quota.remaining}/{quota.limit} left of {quota.policy!r}, whole in {quota.reset_after_ms} ms"
            )


if __name__ == "__main__":
    try:
        main()
    except sluice_client.RetryExhausted as e:
        sys.exit(f"refused {e.retries + 1} times: {e.response.status_code} {e.response.text}")
    except httpx.ConnectError:
        sys.exit(f"nothing answers at {URL}: start the demo with `bash scripts/demo`")
