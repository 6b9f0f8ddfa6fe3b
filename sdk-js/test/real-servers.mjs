// Rate-limited servers built with Node's popular libraries, as their users write them.
//
// Run as `node test/real-servers.mjs KIND LIMIT WINDOW_S` from sdk-js (the libraries are its
// devDependencies, installed by scripts/setup). It serves on a free loopback port and prints
// `{"port": N}` as its first line once it listens. `GET /` is limited to LIMIT requests per
// WINDOW_S seconds per client address by the library named; `GET /stats` (never limited)
// gives what the server answered so far, `{"200": n, "429": m}`. It runs until its standard
// input closes, so it never outlives the test that started it.
//
// Kinds: `express-rate-limit-legacy` (X-RateLimit-* only, the reset an integer epoch),
// `express-rate-limit-draft-6` (RateLimit-Limit/-Remaining/-Reset and RateLimit-Policy),
// `express-rate-limit-draft-7` (combined RateLimit and RateLimit-Policy),
// `express-rate-limit-draft-8` (IETF structured RateLimit and RateLimit-Policy), each with the
// default memory store; `fastify-rate-limit` (@fastify/rate-limit's x-ratelimit-* with the
// reset in delta seconds, its local store); `express-rate-limit-silent` (every header off: a
// bare 429). The SDKs' tests run every kind listed in vectors/servers.json.
import process from 'node:process';

const [kind, limitArg, windowArg] = process.argv.slice(2);
const limit = Number(limitArg);
const windowMs = Number(windowArg) * 1000;
const counts = {};
const count = (status) => {
  counts[status] = (counts[status] ?? 0) + 1;
};

async function expressServer(headers) {
  const { default: express } = await import('express');
  const { rateLimit } = await import('express-rate-limit');
  const app = express();
  const modes = {
    legacy: { standardHeaders: false, legacyHeaders: true },
    'draft-6': { standardHeaders: 'draft-6', legacyHeaders: false },
    'draft-7': { standardHeaders: 'draft-7', legacyHeaders: false },
    'draft-8': { standardHeaders: 'draft-8', legacyHeaders: false },
    silent: { standardHeaders: false, legacyHeaders: false },
  };
  app.get('/stats', (req, res) => res.json(counts));
  app.use((req, res, next) => {
    res.on('finish', () => count(res.statusCode));
    next();
  });
  app.get('/', rateLimit({ windowMs, limit, ...modes[headers] }), (req, res) => res.send('hello'));
  return new Promise((resolve) => {
    const server = app.listen(0, '127.0.0.1', () => resolve(server.address().port));
  });
}

async function fastifyServer() {
  const { default: Fastify } = await import('fastify');
  const { default: rateLimit } = await import('@fastify/rate-limit');
  const app = Fastify();
  await app.register(rateLimit, { global: false });
  app.get('/stats', async () => counts);
  app.get('/', { config: { rateLimit: { max: limit, timeWindow: windowMs } } }, async () => 'hello');
  app.addHook('onResponse', async (req, reply) => {
    if (req.url === '/') count(reply.statusCode);
  });
  return app.listen({ port: 0, host: '127.0.0.1' }).then(() => app.server.address().port);
}

let port;
if (kind.startsWith('express-rate-limit-')) {
  port = await expressServer(kind.slice('express-rate-limit-'.length));
} else if (kind === 'fastify-rate-limit') {
  port = await fastifyServer();
} else {
  throw new Error(`unknown kind ${kind}`);
}
process.stdout.write(`${JSON.stringify({ port })}\n`);
process.stdin.on('end', () => process.exit(0));
process.stdin.resume();
