// A local HTTP server for the tests (node:http, on a free loopback port), the same as the
// Rust SDK's: `/limited` enforces a token bucket with sluice-core's Limiter and sends the
// docs/design.md headers (policy `test`); `/deny-first` refuses the first N requests with
// `Retry-After: 1` (policy `deny_first`);
// `/gate` holds requests until released. Other files are served from `static` roots.
// `startScripted` answers with header lines written out in the test instead, so that what
// the SDK reads does not come from sluice-core's formatter.
import http from 'node:http';
import net from 'node:net';
import { readFile } from 'node:fs/promises';
import path from 'node:path';
import { Limiter, formatHeaders } from '../js/index.js';

const TYPES = { '.js': 'text/javascript', '.mjs': 'text/javascript', '.wasm': 'application/wasm', '.html': 'text/html', '.json': 'application/json' };

/**
 * Starts the server. `limit`/`burst`: `/limited` allows `limit` per second with a burst of
 * `burst`. `denyFirst`: how many requests `/deny-first` refuses. `files`: URL prefix → a
 * directory served read-only; `pages`: path → HTML.
 */
export async function startServer({ limit = 50, burst = 10, denyFirst = 0, files = {}, pages = {} } = {}) {
  const limiter = new Limiter('token_bucket', limit, 1000, burst);
  const started = performance.now();
  const s = {
    hits: 0,
    denials: 0,
    denyFirst,
    /** `[ms since start, status, path]` of every request to a limited route, in order
     *  (`/limited`: when it was decided). */
    log: [],
    held: [],
    url: '',
    /** Lets `n` held `/gate` requests through. */
    release(n = Infinity) {
      while (n-- > 0 && this.held.length > 0) this.held.shift()();
    },
    close: () => new Promise((done) => server.close(done)),
    /** The requests `/limited` admitted, over the most its token bucket can admit in the
     *  span from the first of them to the last (`burst + limit · span`): at most 1, and 1
     *  for a client that used the whole quota. Both from the server's clock, in this run. */
    admittedRatio() {
      const admitted = this.log.filter(([, status, path]) => path === '/limited' && status === 200).map(([ms]) => ms);
      if (admitted.length === 0) return 0;
      const spanS = (admitted[admitted.length - 1] - admitted[0]) / 1000;
      return admitted.length / (burst + limit * spanS);
    },
  };
  const elapsed = () => performance.now() - started;

  function reply(res, status, quota, policy = 'test') {
    const h = formatHeaders('all', policy, quota.limit, quota.remaining, quota.resetAfterMs, quota.windowMs, quota.retryAfterMs, Date.now());
    for (let i = 0; i < h.length; i += 2) res.setHeader(h[i], h[i + 1]);
    res.writeHead(status, { 'content-type': 'text/plain' });
    res.end(status === 200 ? 'ok' : 'slow down');
  }

  const server = http.createServer(async (req, res) => {
    const url = new URL(req.url, 'http://localhost');
    req.resume(); // bodies are not read
    if (url.pathname === '/limited') {
      s.hits += 1;
      const now = elapsed();
      const d = limiter.decide(Math.floor(now), 1);
      const quota = { limit: d.limit, remaining: d.remaining, resetAfterMs: d.resetAfterMs, windowMs: 1000, retryAfterMs: d.allowed ? undefined : d.retryAfterMs };
      const allowed = d.allowed;
      d.free();
      if (!allowed) s.denials += 1;
      s.log.push([now, allowed ? 200 : 429, url.pathname]);
      return reply(res, allowed ? 200 : 429, quota);
    }
    if (url.pathname === '/silent') {
      // `/limited`'s bucket, saying nothing of it: a bare 429 or 200.
      s.hits += 1;
      const now = elapsed();
      const d = limiter.decide(Math.floor(now), 1);
      const allowed = d.allowed;
      d.free();
      if (!allowed) s.denials += 1;
      s.log.push([now, allowed ? 200 : 429, url.pathname]);
      res.writeHead(allowed ? 200 : 429, { 'content-type': 'text/plain' });
      return res.end(allowed ? 'ok' : 'slow down');
    }
    if (url.pathname === '/deny-first') {
      const denied = s.hits < s.denyFirst;
      s.hits += 1;
      if (denied) s.denials += 1;
      s.log.push([elapsed(), denied ? 429 : 200, url.pathname]);
      const quota = { limit: 100, remaining: denied ? 0 : 50, resetAfterMs: 1000, windowMs: 1000, retryAfterMs: denied ? 1000 : undefined };
      return reply(res, denied ? 429 : 200, quota, 'deny_first');
    }
    if (url.pathname === '/gate') {
      s.hits += 1;
      await new Promise((done) => s.held.push(done));
      res.writeHead(200);
      return res.end('ok');
    }
    if (pages[url.pathname] !== undefined) {
      res.writeHead(200, { 'content-type': 'text/html' });
      return res.end(pages[url.pathname]);
    }
    for (const [prefix, dir] of Object.entries(files)) {
      if (!url.pathname.startsWith(prefix)) continue;
      const file = path.join(dir, path.normalize(url.pathname.slice(prefix.length)));
      if (!file.startsWith(dir)) break;
      try {
        const body = await readFile(file);
        res.writeHead(200, { 'content-type': TYPES[path.extname(file)] ?? 'application/octet-stream' });
        return res.end(body);
      } catch {
        break;
      }
    }
    res.writeHead(404);
    res.end('not found');
  });
  server.keepAliveTimeout = 1000;
  await new Promise((done) => server.listen(0, '127.0.0.1', done));
  s.url = `http://127.0.0.1:${server.address().port}`;
  const close = s.close;
  s.close = async () => {
    s.release();
    server.closeAllConnections();
    await close();
    limiter.free();
  };
  return s;
}

/**
 * Starts a server that answers its n-th request (any method and path) with `answers[n]`,
 * or the last one once they run out: the status line and header lines exactly as written in
 * the test, then `Content-Length: 0` and `Connection: close`. `arrivals`: when each
 * request's head had arrived (`performance.now()`), in order.
 */
export async function startScripted(answers) {
  const arrivals = [];
  const sockets = new Set();
  const server = net.createServer((socket) => {
    sockets.add(socket);
    socket.on('close', () => sockets.delete(socket));
    socket.on('error', () => {});
    let head = '';
    socket.on('data', (chunk) => {
      if (head.includes('\r\n\r\n')) return;
      head += chunk;
      if (!head.includes('\r\n\r\n')) return;
      arrivals.push(performance.now());
      const lines = answers[Math.min(arrivals.length, answers.length) - 1];
      socket.end(`${lines.join('\r\n')}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n`);
    });
  });
  await new Promise((done) => server.listen(0, '127.0.0.1', done));
  return {
    url: `http://127.0.0.1:${server.address().port}/`,
    arrivals,
    /** Milliseconds from the arrival of request `i` to that of request `i + 1`. */
    gap: (i) => arrivals[i + 1] - arrivals[i],
    close: () => {
      for (const socket of sockets) socket.destroy();
      return new Promise((done) => server.close(done));
    },
  };
}
