// Pacing against servers we did not write: every server of vectors/servers.json (slowapi,
// Flask-Limiter, express-rate-limit in each header mode, @fastify/rate-limit; and those that
// advertise no quota: Django REST framework, slowapi, Flask-Limiter and express-rate-limit
// with their headers off), started from
// the libraries scripts/setup installed (sdk-python/.venv for the Python ones), each sent
// many requests at once through createFetch(). The server's own counts say how many it
// refused.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import path from 'node:path';
import { createFetch } from '../js/index.js';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../..');
const spec = JSON.parse(readFileSync(path.join(root, 'vectors/servers.json'), 'utf8'));

/** Starts one server of the list; it stops when its standard input closes. */
async function startServer(entry) {
  const args = [entry.kind, String(spec.limit), String(spec.window_s)];
  const [command, script] =
    entry.runtime === 'python'
      ? [path.join(root, 'sdk-python/.venv/bin/python'), path.join(root, 'sdk-python/tests/real_servers.py')]
      : [process.execPath, path.join(root, 'sdk-js/test/real-servers.mjs')];
  const child = spawn(command, [script, ...args], { stdio: ['pipe', 'pipe', 'inherit'] });
  const exited = new Promise((done) => child.once('exit', done));
  const lines = createInterface({ input: child.stdout });
  const first = await Promise.race([
    new Promise((done) => lines.once('line', done)),
    exited.then((code) => assert.fail(`${entry.kind} did not start (exit ${code})`)),
  ]);
  const url = `http://127.0.0.1:${JSON.parse(first).port}`;
  return {
    url,
    stats: async () => (await globalThis.fetch(`${url}/stats`)).json(),
    close: async () => {
      child.stdin.end();
      await exited;
    },
  };
}

// Each server with the bounds it is held to: those that advertise their quota, then the
// silent ones.
const cases = [...spec.servers.map((e) => [e, spec]), ...spec.silent.servers.map((e) => [e, spec.silent])];

for (const [entry, bounds] of cases) {
  test(`${entry.kind}: every request ends 200 at the rate the server allows`, async (t) => {
    const server = await startServer(entry);
    t.after(() => server.close());
    const fetch = createFetch();
    const started = performance.now();
    const responses = await Promise.all(Array.from({ length: spec.requests }, () => fetch(`${server.url}/`)));
    const span = (performance.now() - started) / 1000;
    const seen = await server.stats();
    const ok = seen['200'] ?? 0;
    const refused = seen['429'] ?? 0;
    // The 200s over the span from the first send to the last answer, against limit / window.
    const ratio = ok / span / (spec.limit / spec.window_s);
    t.diagnostic(`${ok} × 200, ${refused} × 429 in ${span.toFixed(2)} s: ${ratio.toFixed(2)} of the allowed rate`);
    assert.deepEqual(
      responses.map((r) => r.status),
      Array(spec.requests).fill(200),
    );
    assert.equal(ok, spec.requests);
    assert.ok(refused <= bounds.max_refused * (ok + refused), `${refused} refused of ${ok + refused}`);
    assert.ok(span >= 5 * spec.window_s, 'the workload spans at least 5 windows');
    assert.ok(ratio >= bounds.min_ratio, `${ratio.toFixed(2)} of the allowed rate (at least ${bounds.min_ratio})`);
  });
}
