// Answers written out here as literal header lines, not formatted by sluice-core (whose
// formatter test/server.mjs uses): what the client reads from them, and how it paces and
// retries by them. Every time is compared with a baseline of the same run.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createFetch, DEFAULTS } from '../js/index.js';
import { startScripted } from './server.mjs';

const X_SPENT = [['HTTP/1.1 200 OK', 'X-RateLimit-Limit: 10', 'X-RateLimit-Remaining: 0', 'X-RateLimit-Reset: 1']];
const X_LEFT = [['HTTP/1.1 200 OK', 'X-RateLimit-Limit: 10', 'X-RateLimit-Remaining: 9', 'X-RateLimit-Reset: 1']];
const IETF_SPENT = [['HTTP/1.1 200 OK', 'RateLimit-Policy: "p";q=10;w=1', 'RateLimit: "p";r=0;t=1']];
const DENIED_FOR_1S = [['HTTP/1.1 429 Too Many Requests', 'Retry-After: 1'], ['HTTP/1.1 200 OK']];
const DENIED_FOR_0S = [['HTTP/1.1 429 Too Many Requests', 'Retry-After: 0'], ['HTTP/1.1 200 OK']];

async function servers(t, ...scripts) {
  const started = await Promise.all(scripts.map(startScripted));
  for (const s of started) t.after(() => s.close());
  return started;
}

// Two GETs one after the other with a fresh client: the first one's quota, and the time
// between their arrivals at the server.
async function twoRequests(server) {
  const fetch = createFetch();
  const first = await fetch(server.url);
  const second = await fetch(server.url);
  assert.deepEqual([first.status, second.status], [200, 200]);
  return { quota: first.rateLimit, gap: server.gap(0) };
}

test('a literal X-RateLimit-Remaining: 0 holds the next request until the literal reset', async (t) => {
  const [spent, left] = await servers(t, X_SPENT, X_LEFT);
  const [s, l] = await Promise.all([twoRequests(spent), twoRequests(left)]);
  assert.deepEqual(s.quota, { limit: 10, remaining: 0, resetAfterMs: 1000, retryAfterMs: undefined, policy: undefined, windowMs: undefined, global: false, partition: undefined, quotas: [] });
  assert.equal(l.quota.remaining, 9);
  t.diagnostic(`next request after ${s.gap.toFixed(1)} ms (remaining 0), ${l.gap.toFixed(1)} ms (remaining 9)`);
  assert.ok(s.gap >= 1000, `sent ${s.gap} ms after, before the reset`);
  assert.ok(l.gap < s.gap / 2, `with 9 left it waited ${l.gap} ms too`);
});

test('literal IETF fields let the next request go after one refill, not at the reset', async (t) => {
  const [ietf, legacy] = await servers(t, IETF_SPENT, X_SPENT);
  const [i, l] = await Promise.all([twoRequests(ietf), twoRequests(legacy)]);
  assert.deepEqual(i.quota, { limit: 10, remaining: 0, resetAfterMs: 1000, retryAfterMs: undefined, policy: 'p', windowMs: 1000, global: false, partition: undefined, quotas: [] });
  t.diagnostic(`next request after ${i.gap.toFixed(1)} ms (IETF, w=1 q=10), ${l.gap.toFixed(1)} ms (X-RateLimit, no window)`);
  // w / q = 100 ms refills one request; without a window only the reset (1 s) does.
  assert.ok(i.gap >= 100, `sent ${i.gap} ms after, before a refill`);
  assert.ok(i.gap < l.gap / 2, `${i.gap} ms: waited for the reset as if no window were known`);
});

test('a literal 429 with Retry-After: 1 is retried after that second', async (t) => {
  const [denied, baseline] = await servers(t, DENIED_FOR_1S, DENIED_FOR_0S);
  // Jitter of at most 1 ms on top of the server's floor.
  const backoff = { ...DEFAULTS.backoff, baseMs: 1 };
  async function send(server) {
    const floors = [];
    const response = await createFetch({ backoff, onRetry: (e) => floors.push(e.floorMs) })(server.url);
    assert.deepEqual([response.status, response.retries], [200, 1]);
    return floors;
  }
  const [floors, baselineFloors] = await Promise.all([send(denied), send(baseline)]);
  const [waited, baselineWaited] = [denied.gap(0), baseline.gap(0)];
  t.diagnostic(`retried after ${waited.toFixed(1)} ms (Retry-After: 1), ${baselineWaited.toFixed(1)} ms (Retry-After: 0)`);
  assert.ok(waited >= 1000, `retried ${waited} ms after, before Retry-After`);
  assert.ok(waited < baselineWaited + 2000, `retried ${waited} ms after, far beyond the 1 s asked`);
  assert.deepEqual(floors, [1000]);
  assert.deepEqual(baselineFloors, [0]);
});

// Discord's bucket header on every answer (discord.com/developers/docs/topics/rate-limits).
const DISCORD_BUCKET = [[
  'HTTP/1.1 200 OK', 'X-RateLimit-Limit: 5', 'X-RateLimit-Remaining: 4', 'X-RateLimit-Reset-After: 1',
  'X-RateLimit-Bucket: abcd1234',
]];

test('routes the server puts in one named bucket share one client bucket', async (t) => {
  const [server] = await servers(t, DISCORD_BUCKET);
  const fetch = createFetch();
  const [a, b] = [`${server.url}/channels/1`, `${server.url}/channels/2`];
  for (const url of [a, b]) assert.equal((await fetch(url)).rateLimit.policy, 'abcd1234');
  assert.ok(fetch.bucketFor(a).endsWith(' abcd1234'), fetch.bucketFor(a));
  assert.equal(fetch.bucketFor(a), fetch.bucketFor(b), 'two routes of one Discord bucket are paced as one');
});

// Discord: routes /a and /b answer with their own bucket, then /a is refused, by the global
// limit ("Example Exceeded Global Rate Limit Response") or by a shared resource's limit,
// then /b is asked again.
const DISCORD_A = ['HTTP/1.1 200 OK', 'X-RateLimit-Limit: 5', 'X-RateLimit-Remaining: 4', 'X-RateLimit-Reset-After: 1', 'X-RateLimit-Bucket: a'];
const DISCORD_B = ['HTTP/1.1 200 OK', 'X-RateLimit-Limit: 5', 'X-RateLimit-Remaining: 4', 'X-RateLimit-Reset-After: 1', 'X-RateLimit-Bucket: b'];
const DISCORD_GLOBAL = [
  DISCORD_A, DISCORD_B,
  ['HTTP/1.1 429 Too Many Requests', 'Retry-After: 1', 'X-RateLimit-Global: true', 'X-RateLimit-Scope: global'],
  DISCORD_B,
];
const DISCORD_SHARED = [
  DISCORD_A, DISCORD_B,
  ['HTTP/1.1 429 Too Many Requests', 'Retry-After: 1', 'X-RateLimit-Limit: 5', 'X-RateLimit-Remaining: 0',
    'X-RateLimit-Reset-After: 1', 'X-RateLimit-Bucket: a', 'X-RateLimit-Scope: shared'],
  DISCORD_B,
];

// /a, /b, /a (refused, not retried), /b with a fresh client: the statuses, and the time from
// the refusal to the next request's arrival.
async function otherRouteAfterA429(server) {
  const fetch = createFetch({ retryStatuses: [] });
  const statuses = [];
  for (const path of ['/a', '/b', '/a', '/b']) statuses.push((await fetch(`${server.url}${path}`)).status);
  return { statuses, gap: server.gap(2) };
}

test('a Discord global 429 holds every route of the host, a shared one only its own', async (t) => {
  const [global, shared] = await servers(t, DISCORD_GLOBAL, DISCORD_SHARED);
  const [g, s] = await Promise.all([otherRouteAfterA429(global), otherRouteAfterA429(shared)]);
  assert.deepEqual(g.statuses, [200, 200, 429, 200]);
  assert.deepEqual(s.statuses, [200, 200, 429, 200]);
  t.diagnostic(`/b after the 429 on /a: ${g.gap.toFixed(1)} ms (global), ${s.gap.toFixed(1)} ms (shared)`);
  assert.ok(g.gap >= 1000, `/b went ${g.gap} ms after a global 429 with Retry-After: 1`);
  assert.ok(s.gap < g.gap / 2, `/b waited ${s.gap} ms for a shared limit on /a's bucket`);
});

// OpenAI's headers (platform.openai.com/docs/guides/rate-limits, "Rate limits in headers") with
// a token quota of 1,000 draining: 600 left after the first request, 200 after the second,
// whole again a second later.
const OPENAI_TOKENS = [
  ['HTTP/1.1 200 OK', 'x-ratelimit-limit-requests: 60', 'x-ratelimit-remaining-requests: 59', 'x-ratelimit-reset-requests: 1s',
    'x-ratelimit-limit-tokens: 1000', 'x-ratelimit-remaining-tokens: 600', 'x-ratelimit-reset-tokens: 1s'],
  ['HTTP/1.1 200 OK', 'x-ratelimit-limit-requests: 60', 'x-ratelimit-remaining-requests: 58', 'x-ratelimit-reset-requests: 1s',
    'x-ratelimit-limit-tokens: 1000', 'x-ratelimit-remaining-tokens: 200', 'x-ratelimit-reset-tokens: 1s'],
  ['HTTP/1.1 200 OK'],
];

// Three requests one after the other, each expected to spend `tokens`: the second one's
// quota, and the time from the second request's arrival to the third's.
async function threeCosting(server, tokens) {
  const fetch = createFetch();
  const quotas = [];
  for (let i = 0; i < 3; i++) {
    const response = await fetch(server.url, { cost: { tokens } });
    assert.equal(response.status, 200);
    quotas.push(response.rateLimit);
  }
  return { quota: quotas[1], gap: server.gap(1) };
}

test('an OpenAI token quota holds a request that would overspend it until its reset', async (t) => {
  const [big, small] = await servers(t, OPENAI_TOKENS, OPENAI_TOKENS);
  const [b, s] = await Promise.all([threeCosting(big, 400), threeCosting(small, 100)]);
  assert.deepEqual([b.quota.limit, b.quota.remaining], [60, 58], 'the requests quota');
  assert.deepEqual(b.quota.quotas, [
    { unit: 'tokens', limit: 1000, remaining: 200, resetAfterMs: 1000, windowMs: undefined, policy: undefined },
  ]);
  t.diagnostic(`third request after ${b.gap.toFixed(1)} ms (400 tokens), ${s.gap.toFixed(1)} ms (100 tokens), 200 left`);
  assert.ok(b.gap >= 1000, `400 tokens went ${b.gap} ms after, with 200 left, before the reset`);
  assert.ok(s.gap < b.gap / 2, `100 tokens fit in the 200 left, yet waited ${s.gap} ms`);
});

test('a cost that is not a non-negative number is an error that names it', async () => {
  const fetch = createFetch({ fetch: async () => new Response('') });
  await assert.rejects(fetch('http://127.0.0.1:9/', { cost: { tokens: 'many' } }), /cost\.tokens must be a non-negative number/);
});
