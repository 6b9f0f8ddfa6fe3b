// A page on one origin calling an API on another, in Debian's Chromium: run by the Rust test
// `a_page_on_another_origin_reads_the_limits_through_envoy` (tests/tests/envoy.rs), which
// starts a real Envoy (its CORS filter allowing this page's origin, exposing nothing, and
// Sluice's filter behind it) and reads what this prints.
//
//   node test/cross-origin.mjs <API origin> <page port> <requests>
//
// Serves the page and the package at http://localhost:<page port>/, opens it, and prints one
// line of JSON: what the SDK's fetch got for <requests> requests sent at once (each status,
// the quota it read, its retries), then what a plain fetch read on the first 429 it met.
import { createServer } from 'node:http';
import { readFile } from 'node:fs/promises';
import { extname, join, normalize } from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';

const [api, portArg, countArg] = process.argv.slice(2);
if (!api || !portArg) {
  console.error('usage: node test/cross-origin.mjs <API origin> <page port> [requests]');
  process.exit(2);
}
const CHROMIUM = process.env.CHROMIUM ?? '/usr/bin/chromium';
const PACKAGE = fileURLToPath(new URL('..', import.meta.url));
const TYPES = { '.js': 'text/javascript', '.wasm': 'application/wasm', '.json': 'application/json' };

const PAGE = `<!doctype html>
<title>sluice-client across origins</title>
<link rel="icon" href="data:,">
<script type="module">
  import { createFetch } from '/pkg/js/index.js';
  const api = ${JSON.stringify(api)};
  const fetch = createFetch();
  const answers = await Promise.all(Array.from({ length: ${Number(countArg ?? 30)} }, () => fetch(api + '/cors')));
  const sdk = answers.map((r) => ({ status: r.status, limit: r.rateLimit?.limit ?? null, retries: r.retries }));
  // A plain fetch, as a page without the SDK: until the API refuses, what a 429 lets it read.
  let refused = null;
  for (let i = 0; i < 200 && !refused; i++) {
    const r = await window.fetch(api + '/cors');
    if (r.status === 429) refused = { retryAfter: r.headers.get('retry-after'), limit: r.headers.get('x-ratelimit-limit'), ratelimit: r.headers.get('ratelimit') };
  }
  window.__result = { sdk, refused };
</script>`;

const server = createServer(async (req, res) => {
  const path = new URL(req.url, 'http://localhost').pathname;
  if (path === '/') {
    res.writeHead(200, { 'content-type': 'text/html' }).end(PAGE);
    return;
  }
  const file = path.startsWith('/pkg/') ? normalize(join(PACKAGE, path.slice(5))) : null;
  if (!file || !file.startsWith(PACKAGE)) {
    res.writeHead(404).end();
    return;
  }
  try {
    const body = await readFile(file);
    res.writeHead(200, { 'content-type': TYPES[extname(file)] ?? 'application/octet-stream' }).end(body);
  } catch {
    res.writeHead(404).end();
  }
});
await new Promise((resolve) => server.listen(Number(portArg), '127.0.0.1', resolve));

const browser = await chromium.launch({
  executablePath: CHROMIUM,
  args: ['--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync'],
});
try {
  const page = await browser.newPage();
  const errors = [];
  page.on('pageerror', (e) => errors.push(String(e)));
  // Chromium logs each 429 as an error; a CORS refusal is logged too, and is what matters.
  page.on('console', (m) => m.type() === 'error' && !/status of 429/.test(m.text()) && errors.push(m.text()));
  await page.goto(`http://localhost:${portArg}/`);
  await page.waitForFunction(() => window.__result !== undefined || undefined, null, { timeout: 60_000 }).catch(() => {});
  const result = await page.evaluate(() => window.__result ?? null);
  console.log(JSON.stringify({ result, errors }));
} finally {
  await browser.close();
  server.close();
}
