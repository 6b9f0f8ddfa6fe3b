// Every case of the header vectors (vectors/headers.json at the repository's root, shared
// with sluice-core's tests), read through the WebAssembly parser; and the parser's robustness.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFile } from 'node:fs/promises';
import { parseHeaders, formatHeaders } from '../js/index.js';

const VECTORS = new URL('../../vectors/headers.json', import.meta.url);

function close(got, want) {
  if (want === undefined || want === null) return got === undefined;
  if (typeof want === 'string') return got === want;
  return got !== undefined && Math.abs(got - want) <= 1;
}

// The quotas in other units, compared by unit in any order.
function quotasMatch(got, want) {
  return (
    got.length === want.length &&
    want.every((w) =>
      got.some(
        (g) =>
          g.unit === w.unit &&
          close(g.limit, w.limit) &&
          close(g.remaining, w.remaining) &&
          close(g.resetAfterMs, w.reset_after_ms) &&
          close(g.windowMs, w.window_ms) &&
          close(g.policy, w.policy),
      ),
    )
  );
}

test('every shared header vector parses as expected', async () => {
  const v = JSON.parse(await readFile(VECTORS, 'utf8'));
  const nowMs = v.now * 1000;
  assert.ok(v.cases.length >= 20, `only ${v.cases.length} cases`);
  const failures = [];
  for (const c of v.cases) {
    const got = parseHeaders(c.status ?? 200, c.headers, nowMs);
    const e = c.expect;
    const ok =
      close(got.limit, e.limit) &&
      close(got.remaining, e.remaining) &&
      close(got.resetAfterMs, e.reset_after_ms) &&
      close(got.retryAfterMs, e.retry_after_ms) &&
      close(got.windowMs, e.window_ms) &&
      close(got.policy, e.policy) &&
      close(got.partition, e.partition) &&
      got.global === (e.global ?? false) &&
      quotasMatch(got.quotas, e.quotas ?? []);
    if (!ok) failures.push(`${c.name}: got ${JSON.stringify(got)}, want ${JSON.stringify(e)}`);
  }
  assert.deepEqual(failures, []);
});

test('headers come as Headers, pairs or a plain object alike', () => {
  const pairs = [['RateLimit', '"api";r=4;t=30'], ['RateLimit-Policy', '"api";q=10;w=60']];
  const want = {
    limit: 10,
    remaining: 4,
    resetAfterMs: 30000,
    retryAfterMs: undefined,
    policy: 'api',
    windowMs: 60000,
    global: false,
    partition: undefined,
    quotas: [],
  };
  assert.deepEqual(parseHeaders(200, pairs), want);
  assert.deepEqual(parseHeaders(200, new Headers(pairs)), want);
  assert.deepEqual(parseHeaders(200, Object.fromEntries(pairs)), want);
});

test('formatted headers parse back to the same quota', () => {
  const now = 1_774_312_800_000;
  const h = formatHeaders('all', 'per_ip', 100, 0, 12_000, 60_000, 12_000, now);
  const pairs = [];
  for (let i = 0; i < h.length; i += 2) pairs.push([h[i], h[i + 1]]);
  assert.deepEqual(parseHeaders(429, pairs, now), {
    limit: 100,
    remaining: 0,
    resetAfterMs: 12_000,
    retryAfterMs: 12_000,
    policy: 'per_ip',
    windowMs: 60_000,
    global: false,
    partition: undefined,
    quotas: [],
  });
  assert.throws(() => formatHeaders('fancy', 'p', 1, 1, 1, 1, undefined, now), /unknown header mode "fancy"/);
});

test('the parser never throws on random input', () => {
  // A seeded generator: the same inputs on every run.
  let x = 0x2545f491;
  const next = () => ((x = (Math.imul(x, 1103515245) + 12345) >>> 0), x);
  const alphabet = ' ",;=:-/0123456789abcdefgrtwqRLX\u00e9\u0000\t\u{1F600}';
  const text = (n) => Array.from({ length: next() % n }, () => alphabet[next() % alphabet.length]).join('');
  const names = ['RateLimit', 'RateLimit-Policy', 'Retry-After', 'X-RateLimit-Limit', 'X-RateLimit-Remaining', 'X-RateLimit-Reset', 'x-other'];
  for (let i = 0; i < 5000; i++) {
    const headers = Array.from({ length: next() % 5 }, () => [names[next() % names.length], text(40)]);
    const q = parseHeaders(next() % 600, headers, next() * 1000);
    for (const k of ['limit', 'remaining', 'resetAfterMs', 'retryAfterMs', 'windowMs']) {
      assert.ok(q[k] === undefined || (Number.isFinite(q[k]) && q[k] >= 0), `${k}: ${q[k]}`);
    }
  }
});
