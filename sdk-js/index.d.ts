// Types of the `sluice-client` package (js/index.js).

/** The quota a response advertises; a field is `undefined` when the response did not say. */
export interface RateLimitInfo {
  /** Requests per window. */
  limit?: number;
  /** Requests left. */
  remaining?: number;
  /** Milliseconds until the quota resets. */
  resetAfterMs?: number;
  /** Milliseconds the server asked the client to wait (`Retry-After`). */
  retryAfterMs?: number;
  /** The name the server gives the quota: the IETF policy, else Discord's bucket or GitHub's resource. */
  policy?: string;
  /** The policy's window in milliseconds. */
  windowMs?: number;
  /** The limit covers every route of the client (Discord's `X-RateLimit-Global: true`):
   *  every bucket of the host waits out `retryAfterMs`. */
  global: boolean;
  /** The IETF partition key (`pk`) of the policy, as sent (`:…:`); it keys the bucket too. */
  partition?: string;
  /** The quotas counted in other units than requests (OpenAI's and Anthropic's tokens, an
   *  IETF policy's `qu`), one per unit; the fields above are the requests quota. */
  quotas: UnitQuota[];
}

/** A quota counted in another unit than requests. */
export interface UnitQuota {
  /** `tokens`, `input-tokens`, `output-tokens`, `content-bytes`, … */
  unit: string;
  limit?: number;
  remaining?: number;
  resetAfterMs?: number;
  windowMs?: number;
  policy?: string;
}

/** `fetch`'s options, and what the request is expected to spend of quotas in other units. */
export interface SluiceRequestInit extends RequestInit {
  /** E.g. `{ tokens: 1200 }`: the request waits until each such quota can take it; a unit
   *  not named counts 1. */
  cost?: Record<string, number>;
}

/** The backoff schedule: full jitter over `baseMs · 2^n` by default. */
export interface BackoffOptions {
  /** First delay's scale (default 1000). */
  baseMs?: number;
  /** No computed delay exceeds this; a server's `Retry-After` may (default 20000). */
  capMs?: number;
  /** Retries after the first attempt; 0 disables retrying (default 5). */
  maxRetries?: number;
  /** No retry starts later than this after the first attempt (default 60000). */
  maxElapsedMs?: number;
  /** `full` (default) or `decorrelated`. */
  jitter?: 'full' | 'decorrelated';
}

/** The retry budget: at most `minRetries + ratio × requests` retries. */
export interface BudgetOptions {
  /** Retries per request, long-run (default 0.1). */
  ratio?: number;
  /** Retries always available, and the most that accumulate (default 10). */
  minRetries?: number;
}

/** The queues: one bounded FIFO per bucket. */
export interface QueueOptions {
  /** Requests that may wait in one bucket; one more fails with `QueueFullError` (default 1024). */
  capacity?: number;
  /** Requests of one bucket in flight at once (default: no limit). */
  maxInFlight?: number;
  /** Whether requests are paced by the advertised quota (default true). */
  pacing?: boolean;
  /** Buckets kept at most; past that the least recently used idle one is forgotten (default 1024). */
  maxBuckets?: number;
  /** The pacer's tuning. */
  pacer?: {
    /** Requests that may always go back to back within the budget (default 10). */
    reserve?: number;
    /** Safety margin on the advertised interval, in percent (default 5). */
    marginPercent?: number;
  };
}

/** A retry about to be waited for. A request refused by a server that advertises no quota
 *  goes back to its bucket's queue instead, which learns the server's rate from the refusals
 *  and holds it as long as that takes: it is reported with a `delayMs` of 0 (the wait is the
 *  queue's) and spends no retry budget. */
export interface RetryEvent {
  /** The bucket of the request. */
  key: string;
  /** Which retry this is (1 for the first). */
  retry: number;
  /** How long the client waits before sending it. */
  delayMs: number;
  /** The status that caused it; `undefined` for a network error. */
  status?: number;
  /** What the server asked for: `Retry-After`, or the reset of a spent quota. */
  floorMs?: number;
  /** The network error that caused it. */
  error?: unknown;
}

export interface SluiceOptions {
  /** The `fetch` to wrap (default `globalThis.fetch`). */
  fetch?: (request: Request) => Promise<Response>;
  backoff?: BackoffOptions;
  /** Statuses retried (default `[429, 503]`). */
  retryStatuses?: number[];
  /** Whether network errors are retried (default true). */
  retryNetworkErrors?: boolean;
  /** Whether requests neither idempotent nor carrying an `Idempotency-Key` are retried (default false). */
  retryNonIdempotent?: boolean;
  budget?: BudgetOptions;
  queue?: QueueOptions;
  /** Called with every retry scheduled, before the wait. */
  onRetry?: (event: RetryEvent) => void;
  /** Seeds the jitter (default: random). */
  seed?: number | bigint;
  /** The bucket of a request; `undefined` for the default (host:port, joined by the policy its route was seen under). */
  bucket?: (request: Request) => string | undefined;
}

/** A response of a Sluice `fetch`, with the quota it advertised. */
export interface SluiceResponse extends Response {
  readonly rateLimit: RateLimitInfo;
  /** Retries it took. */
  readonly retries: number;
}

/** A drop-in `fetch` that paces, retries and reads rate-limit headers. */
export interface SluiceFetch {
  (input: RequestInfo | URL, init?: SluiceRequestInit): Promise<SluiceResponse>;
  /** The bucket a request to `url` joins now. */
  bucketFor(url: string | URL): string;
  /** Requests waiting in bucket `key` (not those in flight). */
  queued(key: string): number;
  /** Buckets held now (at most `queue.maxBuckets` while they are idle). */
  buckets(): number;
  /** Retries the budget allows right now. */
  retriesAvailable(): number;
}

/** Returns a drop-in `fetch`; throws a `TypeError` naming a bad or unknown option. */
export function createFetch(options?: SluiceOptions): SluiceFetch;

/** Reads rate-limit headers; malformed values are ignored. */
export function parseHeaders(
  status: number,
  headers: Headers | Iterable<[string, string]> | Record<string, string>,
  nowMs?: number,
): RateLimitInfo;

/** The quota a response of a Sluice `fetch` advertised. */
export function rateLimitOf(response: Response): RateLimitInfo | undefined;

/** A request refused at once because its bucket's queue is full. */
export class QueueFullError extends Error {
  readonly key: string;
  readonly capacity: number;
}

/** The defaults of every option (the Rust SDK's). */
export const DEFAULTS: Readonly<Required<Omit<SluiceOptions, 'fetch' | 'onRetry' | 'seed' | 'bucket'>>>;

/** The headers a server sends for a quota, as `[name, value, name, value, …]`. */
export function formatHeaders(
  mode: 'all' | 'legacy' | 'ietf' | 'none',
  policy: string,
  limit: number,
  remaining: number,
  resetAfterMs: number,
  windowMs: number,
  retryAfterMs: number | undefined,
  nowMs: number,
): string[];

/** One limit of sluice-core (any algorithm), for servers and tests. */
export class Limiter {
  constructor(algorithm: string, limit: number, windowMs: number, burst: number);
  decide(nowMs: number, cost: number): {
    readonly allowed: boolean;
    readonly limit: number;
    readonly remaining: number;
    readonly resetAfterMs: number;
    readonly retryAfterMs: number;
    free(): void;
  };
  readonly windowMs: number;
  free(): void;
}
