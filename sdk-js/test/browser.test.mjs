// The package in a real headless Chromium (Debian's, driven by playwright-core): a page
// served from localhost imports it as an ES module (the WebAssembly is fetched by URL, as
// in any browser) and runs a retried request and a paced burst against the test server.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';
import { startServer } from './server.mjs';

const CHROMIUM = process.env.CHROMIUM ?? '/usr/bin/chromium';
const PACKAGE = fileURLToPath(new URL('..', import.meta.url));

const PAGE = `<!doctype html>
<title>sluice-client in a browser</title>
<link rel="icon" href="data:,">
<script type="module">
  import { createFetch } from '/pkg/js/index.js';
  const retries = [];
  const fetch = createFetch({ onRetry: (e) => retries.push({ delayMs: e.delayMs, floorMs: e.floorMs, status: e.status }) });
  const first = await fetch('/deny-first');
  const started = performance.now();
  const paced = await Promise.all(Array.from({ length: 20 }, () => fetch('/limited')));
  window.__result = {
    first: { status: first.status, retries: first.retries, quota: first.rateLimit },
    retries,
    statuses: paced.map((r) => r.status),
    limits: paced.map((r) => r.rateLimit.limit),
    pacedMs: performance.now() - started,
  };
</script>`;

test('in Chromium: a 429 is retried after Retry-After and a burst is paced under the quota', async (t) => {
  assert.ok(existsSync(CHROMIUM), `${CHROMIUM} is missing: install Debian's chromium (bash scripts/setup does)`);
  // 10/s with a burst of 5: 20 requests sent at once would see 15 refusals.
  const server = await startServer({ limit: 10, burst: 5, denyFirst: 1, files: { '/pkg/': PACKAGE }, pages: { '/': PAGE } });
  t.after(() => server.close());
  const browser = await chromium.launch({
    executablePath: CHROMIUM,
    args: ['--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
  t.after(() => browser.close());
  const page = await browser.newPage();
  const errors = [];
  page.on('pageerror', (e) => errors.push(String(e)));
  // Chromium logs every 429 it receives as an error; those are expected here.
  const expected = /^Failed to load resource: the server responded with a status of 429/;
  page.on('console', (m) => m.type() === 'error' && !expected.test(m.text()) && errors.push(m.text()));
  await page.goto(`${server.url}/`);
  await page.waitForFunction(() => window.__result !== undefined || undefined, null, { timeout: 30_000 }).catch(() => {});
  assert.deepEqual(errors, []);
  const result = await page.evaluate(() => window.__result);
  assert.ok(result, 'the page finished its requests');

  assert.equal(result.first.status, 200);
  assert.equal(result.first.retries, 1);
  assert.equal(result.retries.length, 1);
  assert.equal(result.retries[0].status, 429);
  assert.equal(result.retries[0].floorMs, 1000);
  assert.ok(result.retries[0].delayMs >= 1000, `retry scheduled after ${result.retries[0].delayMs} ms`);
  const [denied, admitted] = server.log;
  assert.equal(denied[1], 429);
  assert.ok(admitted[0] - denied[0] >= 1000, `retried after ${admitted[0] - denied[0]} ms`);

  assert.deepEqual(new Set(result.statuses), new Set([200]));
  assert.deepEqual(new Set(result.limits), new Set([10]));
  const limitedDenials = server.log.slice(2).filter(([, s]) => s === 429).length;
  const ratio = server.admittedRatio();
  t.diagnostic(
    `20 requests at 10/s (burst 5) in ${Math.round(result.pacedMs)} ms with ${limitedDenials} × 429, ` +
      `admitted ${ratio.toFixed(3)} of what the bucket allowed over the same span`,
  );
  assert.equal(limitedDenials, 0, 'refusals of the paced burst');
  // As in fetch.test.mjs, but the client has its own process here: measured 0.975–0.992,
  // also with two runs at once beside three busy loops.
  assert.ok(ratio >= 0.9, `used only ${ratio.toFixed(3)} of the quota`);
});
