// A real sluice-service node for the console's tests: target/debug/sluice-service (built by
// `cargo build -p sluice-service`, as scripts/test does first) with the memory store, a rules
// file, an admin and a read-only token, on free loopback ports.
import { spawn } from 'node:child_process';
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import net from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

export const ROOT = fileURLToPath(new URL('../../../', import.meta.url));
const BIN = process.env.SLUICE_SERVICE_BIN ?? join(ROOT, 'target/debug/sluice-service');

// The node's environment: this test's, less the SLUICE_* variables that configure the test
// itself (a node refuses a SLUICE_* variable no flag of its own reads).
const nodeEnv = () => Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith('SLUICE_')));

const given = new Set();
/** A loopback port free now, drawn as testkit's free_port draws (below the ephemeral range). */
export async function freePort() {
  for (let attempt = 0; attempt < 1000; attempt++) {
    const port = 12_000 + Math.floor(Math.random() * 20_000);
    if (given.has(port)) continue;
    const free = await new Promise((resolve) => {
      const s = net.createServer();
      s.once('error', () => resolve(false));
      s.listen(port, '127.0.0.1', () => s.close(() => resolve(true)));
    });
    if (free) {
      given.add(port);
      return port;
    }
  }
  throw new Error('no free loopback port');
}

async function waitForPort(port, child, timeoutMs = 30_000) {
  const started = Date.now();
  for (;;) {
    if (child.exitCode !== null) throw new Error(`sluice-service exited (${child.exitCode}) before listening`);
    const up = await new Promise((resolve) => {
      const c = net.connect(port, '127.0.0.1');
      c.once('connect', () => {
        c.destroy();
        resolve(true);
      });
      c.once('error', () => resolve(false));
    });
    if (up) return;
    if (Date.now() - started > timeoutMs) throw new Error(`nothing listens on ${port} after ${timeoutMs} ms`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

/**
 * Starts a node with `rules` (TOML text). Returns its data and admin URLs, the two tokens,
 * its log so far (`log()`), `check(identities, path)` and `stop()`.
 */
export async function startNode(rules, { name = 'console-test-node' } = {}) {
  if (!existsSync(BIN)) throw new Error(`${BIN} is missing: cargo build -p sluice-service --bin sluice-service`);
  const dir = mkdtempSync(join(tmpdir(), 'sluice-console-'));
  const files = {
    rules: join(dir, 'rules.toml'),
    admin: join(dir, 'admin-token'),
    read: join(dir, 'read-token'),
  };
  const adminToken = `admin-${Math.random().toString(36).slice(2)}`;
  const readToken = `read-${Math.random().toString(36).slice(2)}`;
  writeFileSync(files.rules, rules);
  writeFileSync(files.admin, `${adminToken}\n`);
  writeFileSync(files.read, `${readToken}\n`);
  const [dataPort, adminPort] = [await freePort(), await freePort()];
  const child = spawn(BIN, [
    '--listen', `127.0.0.1:${dataPort}`,
    '--admin-listen', `127.0.0.1:${adminPort}`,
    '--rules', files.rules,
    '--admin-token-file', files.admin,
    '--admin-read-token-file', files.read,
    '--node-name', name,
  ], { stdio: ['ignore', 'pipe', 'pipe'], env: nodeEnv() });
  let log = '';
  child.stdout.on('data', (d) => (log += d));
  child.stderr.on('data', (d) => (log += d));
  try {
    await waitForPort(dataPort, child);
    await waitForPort(adminPort, child);
  } catch (e) {
    child.kill('SIGKILL');
    throw new Error(`${e.message}\n${log}`);
  }
  const data = `http://127.0.0.1:${dataPort}`;
  return {
    name,
    data,
    admin: `http://127.0.0.1:${adminPort}`,
    adminToken,
    readToken,
    rulesFile: files.rules,
    log: () => log,
    /** POST /v1/check; returns the answer's JSON. */
    async check(identities, path = '/api/orders') {
      const res = await fetch(`${data}/v1/check`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ identities, method: 'GET', path }),
      });
      return res.json();
    },
    /** An admin API call with the admin token: [status, JSON]. */
    async adminApi(method, path, body) {
      const res = await fetch(`http://127.0.0.1:${adminPort}${path}`, {
        method,
        headers: { authorization: `Bearer ${adminToken}`, 'content-type': 'application/json' },
        body: body === undefined ? undefined : JSON.stringify(body),
      });
      return [res.status, await res.json().catch(() => null)];
    },
    async stop() {
      if (child.exitCode === null) {
        const ended = new Promise((r) => child.once('exit', r));
        child.kill('SIGTERM');
        const timer = setTimeout(() => child.kill('SIGKILL'), 5000);
        await ended;
        clearTimeout(timer);
      }
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
