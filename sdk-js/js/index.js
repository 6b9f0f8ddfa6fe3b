// sluice-client: a `fetch` that respects the rate limits servers advertise.
//
// A thin layer over `fetch`: every decision (what a response's headers say, when a bucket's
// next request may go, how long to back off, whether the retry budget allows one more) is
// made by sluice-core, compiled to WebAssembly (../wasm, built by `npm run build`), so this
// SDK behaves as the Rust one does. This file only queues, waits and calls `fetch`.

import init, * as core from '../wasm/sluice_js.js';

await load();

/** Loads the WebAssembly: from the file system in Node, by URL in a browser. */
async function load() {
  const url = new URL('../wasm/sluice_js_bg.wasm', import.meta.url);
  if (url.protocol === 'file:' && typeof process === 'object' && process.versions?.node) {
    const { readFile } = await import('node:fs/promises');
    await init({ module_or_path: await readFile(url) });
  } else {
    await init({ module_or_path: url });
  }
}

const CORE_DEFAULTS = JSON.parse(core.defaultsJson());

/** The defaults of every option; the same as the Rust SDK's (most come from sluice-core). */
export const DEFAULTS = deepFreeze({
  backoff: CORE_DEFAULTS.backoff,
  retryStatuses: [429, 503],
  retryNetworkErrors: true,
  retryNonIdempotent: false,
  budget: CORE_DEFAULTS.budget,
  queue: { capacity: 1024, maxInFlight: undefined, pacing: true, pacer: CORE_DEFAULTS.pacer, maxBuckets: 1024 },
});

/** A request refused at once because its bucket's queue is full. */
export class QueueFullError extends Error {
  constructor(key, capacity) {
    super(`the queue of bucket "${key}" is full (${capacity} waiting); slow down or raise queue.capacity`);
    this.name = 'QueueFullError';
    this.key = key;
    this.capacity = capacity;
  }
}

/**
 * Reads the rate-limit headers of a response (`X-RateLimit-*`, IETF `RateLimit` /
 * `RateLimit-Policy`, `Retry-After` and common variants). Malformed values are ignored.
 * `headers` is a `Headers`, an iterable of `[name, value]` or a plain object.
 */
export function parseHeaders(status, headers, nowMs = Date.now()) {
  const quota = parse(status, headers, nowMs);
  try {
    return plain(quota);
  } finally {
    quota.free();
  }
}

function parse(status, headers, nowMs) {
  const names = [];
  const values = [];
  const entries = headers && typeof headers[Symbol.iterator] === 'function' ? headers : Object.entries(headers ?? {});
  for (const [name, value] of entries) {
    names.push(String(name));
    values.push(String(value));
  }
  return core.parseHeaders(status, names, values, nowMs);
}

function plain(quota) {
  return {
    limit: quota.limit,
    remaining: quota.remaining,
    resetAfterMs: quota.resetAfterMs,
    retryAfterMs: quota.retryAfterMs,
    policy: quota.policy,
    windowMs: quota.windowMs,
    global: quota.global,
    partition: quota.partition,
    quotas: quota.units.map((unit) => {
      const q = quota.unitQuota(unit);
      try {
        return { unit, limit: q.limit, remaining: q.remaining, resetAfterMs: q.resetAfterMs, windowMs: q.windowMs, policy: q.policy };
      } finally {
        q.free();
      }
    }),
  };
}

/** A request's expected cost (`{ tokens: 1200 }`) as the pacer takes it: units, amounts. */
function costOf(cost) {
  const units = [];
  const amounts = [];
  for (const [unit, amount] of Object.entries(cost ?? {})) {
    if (typeof amount !== 'number' || !(amount >= 0)) {
      throw new TypeError(`cost.${unit} must be a non-negative number of ${unit}, not ${String(amount)}`);
    }
    units.push(unit);
    amounts.push(amount);
  }
  return { units, amounts };
}

const QUOTAS = new WeakMap();

/** The quota a response returned by a Sluice `fetch` advertised (also `response.rateLimit`). */
export function rateLimitOf(response) {
  return QUOTAS.get(response);
}

/**
 * Returns a drop-in `fetch` that reads the rate-limit headers of every response
 * (`response.rateLimit`), queues and paces requests per bucket, and retries 429/503 and
 * network errors with full-jitter backoff after the server's `Retry-After`, for idempotent
 * requests (or those with an `Idempotency-Key`) while the retry budget lasts.
 * An `AbortSignal` on the request takes it out of its queue at once. `init.cost` gives what
 * a request is expected to spend of quotas counted in other units than requests
 * (`{ tokens: 1200 }`): it waits until each quota its bucket's responses report can take it,
 * and the responses' figures correct the estimate; a unit not named counts 1.
 */
export function createFetch(options = {}) {
  const opts = resolve(options);
  const clock = monotonic();
  const budget = new core.RetryBudget(opts.budget.ratio, opts.budget.minRetries);
  const rng = new core.Rng(seed(opts.seed));
  const buckets = new Map();
  const routes = new Map(); // "host:port/path" → the policy it was last seen under
  const holds = new Map(); // "host:port" → when a global limit lets it be called again

  // The bucket `key`, now the most recently used (a Map keeps insertion order: the least
  // recently used come first). Past `queue.maxBuckets`, the least recently used idle bucket
  // (nothing queued or in flight) is forgotten and its pacer freed, as the Rust SDK does.
  function bucketNamed(key) {
    let bucket = buckets.get(key);
    if (bucket) {
      buckets.delete(key);
    } else {
      if (buckets.size >= opts.queue.maxBuckets) forgetIdle();
      bucket = new Bucket(key, opts.queue, clock);
    }
    buckets.set(key, bucket);
    return bucket;
  }

  function forgetIdle() {
    for (const [key, bucket] of buckets) {
      if (bucket.idle()) {
        buckets.delete(key);
        bucket.free();
        return;
      }
    }
  }

  function bucketFor(url) {
    const u = new URL(url);
    const policy = routes.get(route(u));
    return policy === undefined ? hostKey(u) : `${hostKey(u)} ${policy}`;
  }

  // A response on `url` named `policy`: the route joins that policy's bucket. The host
  // bucket, whose pacer learned the policy's quota, is handed over to the policy (unless it
  // has a bucket already) and the host starts over, so a route not seen yet sends one probe
  // rather than trusting another route's quota (as the Rust SDK does).
  function learn(url, policy) {
    if (policy === undefined) return;
    const u = new URL(url);
    const r = route(u);
    if (routes.get(r) === policy) return;
    if (routes.size >= MAX_ROUTES) routes.clear();
    routes.set(r, policy);
    const host = hostKey(u);
    const hostBucket = buckets.get(host);
    if (!hostBucket) return;
    buckets.delete(host);
    const to = `${host} ${policy}`;
    if (!buckets.has(to)) buckets.set(to, hostBucket);
    else if (hostBucket.idle()) hostBucket.free();
  }

  async function sluiceFetch(input, init) {
    const request = new Request(input, init);
    const signal = request.signal;
    const fixed = opts.bucket?.(request);
    const cost = costOf(init?.cost);
    budget.deposit();
    const retryable =
      opts.retryNonIdempotent || core.isIdempotent(request.method) || request.headers.has('idempotency-key');
    const b = opts.backoff;
    const backoff = new core.Backoff(b.baseMs, b.capMs, b.maxRetries, b.maxElapsedMs, b.jitter);
    const started = clock();
    let retries = 0;
    try {
      for (;;) {
        const key = fixed ?? bucketFor(request.url);
        const bucket = bucketNamed(key);
        const ticket = await bucket.acquire(signal, cost);
        await heldBack(hostKey(new URL(request.url)), signal);
        const { response, info, floor, error, requeue } = await attempt(
          bucket,
          ticket,
          retryable ? request.clone() : request,
        );
        const worth = error
          ? opts.retryNetworkErrors && isNetworkError(error)
          : opts.retryStatuses.includes(response.status);
        // A refusal from a server that advertises no quota: the bucket's pacer learned from
        // it and holds the bucket, so the request queues again at once (delay 0), spending
        // no retry, for as long as the schedule lets a request be retried at all.
        const requeued = requeue && clock() - started <= b.maxElapsedMs ? 0 : undefined;
        const delay = retryable && worth ? (requeued ?? schedule(backoff, started, floor)) : undefined;
        if (delay === undefined) {
          if (error) throw error;
          return expose(response, info, retries);
        }
        retries += 1;
        opts.onRetry?.({ key, retry: retries, delayMs: delay, status: response?.status, floorMs: floor, error });
        await response?.body?.cancel().catch(() => {}); // frees the connection
        await sleep(delay, signal);
      }
    } finally {
      backoff.free();
    }
  }

  // Sends one attempt and reports its outcome to the bucket: `{response, info, floor}`, or
  // `{error}` when no response came.
  async function attempt(bucket, ticket, request) {
    let response;
    try {
      response = await opts.fetch(request);
    } catch (error) {
      bucket.failed(ticket);
      return { error };
    }
    const quota = parse(response.status, response.headers, Date.now());
    try {
      const requeue = bucket.answered(quota, ticket) && response.status === 429;
      const info = plain(quota);
      if (info.global && info.retryAfterMs !== undefined) hold(hostKey(new URL(request.url)), info.retryAfterMs);
      learn(response.url || request.url, quota.bucketName);
      return { response, info, floor: quota.serverFloorMs(), requeue };
    } finally {
      quota.free();
    }
  }

  // A limit that covers every route of the client (Discord's global limit) holds every
  // bucket of the host, not only the refused route's, for its Retry-After.
  function hold(host, ms) {
    if (holds.size >= MAX_ROUTES) {
      for (const [h, until] of holds) if (until <= clock()) holds.delete(h);
      if (holds.size >= MAX_ROUTES) holds.clear();
    }
    holds.set(host, Math.max(holds.get(host) ?? 0, clock() + ms));
  }

  async function heldBack(host, signal) {
    for (let until = holds.get(host); until !== undefined && until > clock(); until = holds.get(host)) {
      await sleep(until - clock(), signal);
    }
  }

  // The delay before the next retry, if the schedule and the retry budget allow one.
  function schedule(backoff, started, floorMs) {
    const delay = backoff.nextDelay(clock() - started, floorMs, rng);
    return delay !== undefined && budget.tryWithdraw() ? delay : undefined;
  }

  sluiceFetch.bucketFor = bucketFor;
  sluiceFetch.queued = (key) => buckets.get(key)?.waiting.length ?? 0;
  sluiceFetch.buckets = () => buckets.size;
  sluiceFetch.retriesAvailable = () => budget.available;
  return sluiceFetch;
}

/** Routes remembered at most; past that the memory starts over. */
const MAX_ROUTES = 1024;

function hostKey(u) {
  const port = u.port || { 'http:': '80', 'https:': '443' }[u.protocol] || '';
  return port ? `${u.hostname}:${port}` : u.hostname;
}

function route(u) {
  return `${hostKey(u)}${u.pathname}`;
}

function expose(response, info, retries) {
  QUOTAS.set(response, info);
  Object.defineProperty(response, 'rateLimit', { value: info, enumerable: true });
  Object.defineProperty(response, 'retries', { value: retries, enumerable: true });
  return response;
}

/** A `fetch` failure that is the network's (not an abort, not a bad argument). */
function isNetworkError(error) {
  return error instanceof TypeError && error.name === 'TypeError';
}

/** One bucket: a bounded FIFO of waiting requests, released by the pacer. */
class Bucket {
  constructor(key, queue, clock) {
    this.key = key;
    this.queue = queue;
    this.clock = clock;
    this.pacer = queue.pacing ? new core.Pacer(queue.pacer.reserve, queue.pacer.marginPercent) : null;
    this.waiting = [];
    this.inFlight = 0;
    this.timer = undefined;
  }

  /** Resolves with the pacer's ticket when the request may go; rejects at once when the
   *  queue is full. */
  acquire(signal, cost) {
    if (signal?.aborted) return Promise.reject(signal.reason);
    if (this.waiting.length >= this.queue.capacity) {
      return Promise.reject(new QueueFullError(this.key, this.queue.capacity));
    }
    return new Promise((resolve, reject) => {
      const waiter = { resolve, signal, cost, onAbort: undefined };
      if (signal) {
        waiter.onAbort = () => {
          const i = this.waiting.indexOf(waiter);
          if (i >= 0) this.waiting.splice(i, 1);
          reject(signal.reason);
          this.pump();
        };
        signal.addEventListener('abort', waiter.onAbort, { once: true });
      }
      this.waiting.push(waiter);
      this.pump();
    });
  }

  /** Lets the head of the queue go while the pacer and the concurrency limit allow. */
  pump() {
    clearTimeout(this.timer);
    this.timer = undefined;
    while (this.waiting.length > 0) {
      const max = this.queue.maxInFlight;
      if (max !== undefined && this.inFlight >= max) return;
      const now = this.clock();
      const { units, amounts } = this.waiting[0].cost;
      const at = this.pacer ? this.pacer.nextSendAt(now, units, amounts) : now;
      if (at === undefined) return; // an answer will tell more
      if (at > now) {
        this.timer = setTimeout(() => this.pump(), at - now);
        return;
      }
      const waiter = this.waiting.shift();
      waiter.signal?.removeEventListener('abort', waiter.onAbort);
      const ticket = this.pacer ? this.pacer.onSend(now, units, amounts) : 0;
      this.inFlight += 1;
      waiter.resolve(ticket);
    }
  }

  /** Nothing queued, nothing in flight: the bucket may be forgotten. */
  idle() {
    return this.waiting.length === 0 && this.inFlight === 0;
  }

  /** Frees the pacer's WebAssembly memory; only for an idle bucket no one holds. */
  free() {
    clearTimeout(this.timer);
    this.pacer?.free();
    this.pacer = null;
  }

  /** Records an answer; returns whether the pacer learns the quota from refusals (then a
   *  refused request queues again rather than being retried). */
  answered(quota, ticket) {
    this.pacer?.observe(quota, this.clock(), ticket);
    this.inFlight -= 1;
    this.pump();
    return this.pacer?.adapts() ?? false;
  }

  failed(ticket) {
    this.pacer?.onFailure(ticket);
    this.inFlight -= 1;
    this.pump();
  }
}

function sleep(ms, signal) {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal.reason);
    };
    const timer = setTimeout(() => {
      signal?.removeEventListener('abort', onAbort);
      resolve();
    }, ms);
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}

/** Milliseconds on a monotonic clock, as whole numbers. */
function monotonic() {
  const start = performance.now();
  return () => Math.floor(performance.now() - start);
}

function seed(given) {
  if (given !== undefined) return BigInt.asUintN(64, BigInt(given));
  return globalThis.crypto.getRandomValues(new BigUint64Array(1))[0];
}

// Options ------------------------------------------------------------------------------

const KNOWN = {
  top: ['fetch', 'backoff', 'retryStatuses', 'retryNetworkErrors', 'retryNonIdempotent', 'budget', 'queue', 'onRetry', 'seed', 'bucket'],
  backoff: ['baseMs', 'capMs', 'maxRetries', 'maxElapsedMs', 'jitter'],
  budget: ['ratio', 'minRetries'],
  queue: ['capacity', 'maxInFlight', 'pacing', 'pacer', 'maxBuckets'],
  pacer: ['reserve', 'marginPercent'],
};

function fields(where, given, known) {
  if (given === undefined) return {};
  if (given === null || typeof given !== 'object') throw new TypeError(`sluice: ${where} must be an object`);
  const unknown = Object.keys(given).filter((k) => !known.includes(k));
  if (unknown.length > 0) {
    throw new TypeError(`sluice: unknown option ${unknown.map((k) => `${where}.${k}`).join(', ')}; known: ${known.join(', ')}`);
  }
  return given;
}

function count(where, value, { min = 0, integer = true } = {}) {
  if (typeof value !== 'number' || !Number.isFinite(value) || value < min || (integer && !Number.isInteger(value))) {
    throw new TypeError(`sluice: ${where} must be a finite ${integer ? 'whole ' : ''}number ≥ ${min}, not ${String(value)}`);
  }
  return value;
}

/** The options with defaults filled in; throws a TypeError naming a bad or unknown one. */
function resolve(options) {
  const o = fields('options', options, KNOWN.top);
  const b = { ...DEFAULTS.backoff, ...fields('backoff', o.backoff, KNOWN.backoff) };
  for (const k of ['baseMs', 'capMs', 'maxRetries', 'maxElapsedMs']) count(`backoff.${k}`, b[k]);
  if (b.jitter !== 'full' && b.jitter !== 'decorrelated') {
    throw new TypeError(`sluice: backoff.jitter must be "full" or "decorrelated", not ${JSON.stringify(b.jitter)}`);
  }
  const budget = { ...DEFAULTS.budget, ...fields('budget', o.budget, KNOWN.budget) };
  count('budget.ratio', budget.ratio, { integer: false });
  count('budget.minRetries', budget.minRetries);
  const q = fields('queue', o.queue, KNOWN.queue);
  const queue = { ...DEFAULTS.queue, ...q, pacer: { ...DEFAULTS.queue.pacer, ...fields('queue.pacer', q.pacer, KNOWN.pacer) } };
  count('queue.capacity', queue.capacity);
  if (queue.maxInFlight !== undefined) count('queue.maxInFlight', queue.maxInFlight, { min: 1 });
  count('queue.maxBuckets', queue.maxBuckets, { min: 1 });
  count('queue.pacer.reserve', queue.pacer.reserve);
  count('queue.pacer.marginPercent', queue.pacer.marginPercent);
  const statuses = o.retryStatuses ?? DEFAULTS.retryStatuses;
  if (!Array.isArray(statuses) || !statuses.every((s) => Number.isInteger(s) && s >= 100 && s <= 599)) {
    throw new TypeError('sluice: retryStatuses must be an array of HTTP status codes');
  }
  for (const k of ['fetch', 'onRetry', 'bucket']) {
    if (o[k] !== undefined && typeof o[k] !== 'function') throw new TypeError(`sluice: ${k} must be a function`);
  }
  if (o.fetch === undefined && typeof globalThis.fetch !== 'function') {
    throw new TypeError('sluice: no global fetch here; pass options.fetch');
  }
  // The global fetch must be called on the global object (browsers throw otherwise).
  const fetchImpl = o.fetch ?? ((request) => globalThis.fetch(request));
  return {
    fetch: fetchImpl,
    backoff: b,
    retryStatuses: statuses,
    retryNetworkErrors: o.retryNetworkErrors ?? DEFAULTS.retryNetworkErrors,
    retryNonIdempotent: o.retryNonIdempotent ?? DEFAULTS.retryNonIdempotent,
    budget,
    queue,
    onRetry: o.onRetry,
    seed: o.seed,
    bucket: o.bucket,
  };
}

function deepFreeze(value) {
  if (value && typeof value === 'object') {
    for (const v of Object.values(value)) deepFreeze(v);
    Object.freeze(value);
  }
  return value;
}

/** sluice-core's own pieces, for servers and tests written in JavaScript. */
export const { Limiter, formatHeaders } = core;
