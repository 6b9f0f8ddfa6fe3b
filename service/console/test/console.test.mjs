// The operator's console (service/console, issue 43) in a real headless Chromium (Debian's,
// driven by playwright-core as sdk-js's browser test) against a real sluice-service node:
// an operator logs in, watches a rule start refusing under load and its top identity appear,
// explains a request, adds an override and sees it let a refused client through, removes it,
// resets a counter; hostile names show as text; a read-only token sees the page but its
// change is refused. Also: the page's weight and the time to render 1,000 rules.
//
// Screenshots go to target/console-screenshots/, or to docs/console/ (the ones
// docs/operations.md shows) with SLUICE_CONSOLE_SCREENSHOTS=docs.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { chromium } from 'playwright-core';
import { ROOT, startNode } from './node.mjs';

const CHROMIUM = process.env.CHROMIUM ?? '/usr/bin/chromium';
const SHOTS = process.env.SLUICE_CONSOLE_SCREENSHOTS === 'docs'
  ? join(ROOT, 'docs/console')
  : join(ROOT, 'target/console-screenshots');
const HOSTILE_RULE = '<img src=x onerror=alert(1)>';
const HOSTILE_ID = '<script>window.__pwned=1</script><b>mallory</b>';
const BIDI_ID = '\u202Egnp.exe';

const RULES = `
[[rule]]
name      = "per-ip"
by        = "ip"
path      = "/api/*"
algorithm = "fixed_window"
limit     = 3
window    = "1h"

[[rule]]
name      = "per-user"
by        = "user"
algorithm = "fixed_window"
limit     = 1000
window    = "1h"

[[rule]]
name      = '${HOSTILE_RULE}'
by        = "user"
path      = "/hostile"
algorithm = "fixed_window"
limit     = 1
window    = "1h"
`;

async function launch(t) {
  assert.ok(existsSync(CHROMIUM), `${CHROMIUM} is missing: install Debian's chromium (bash scripts/setup does)`);
  const browser = await chromium.launch({
    executablePath: CHROMIUM,
    args: ['--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
  t.after(() => browser.close());
  return browser;
}

/** A new tab (its own sessionStorage) that fails the test on any script error or dialog. */
async function newPage(browser, errors) {
  const context = await browser.newContext({ viewport: { width: 1280, height: 860 } });
  const page = await context.newPage();
  page.on('pageerror', (e) => errors.push(`pageerror: ${e}`));
  page.on('dialog', (d) => {
    errors.push(`dialog: ${d.message()}`);
    d.dismiss();
  });
  // Chromium logs each 4xx answer a fetch gets; the page shows those itself.
  const expected = /^Failed to load resource: the server responded with a status of (400|403|404)/;
  page.on('console', (m) => {
    if (m.type() !== 'error' || expected.test(m.text()) || m.location().url.endsWith('/favicon.ico')) return;
    errors.push(m.text());
  });
  return page;
}

async function login(page, node, token, operator) {
  await page.goto(`${node.admin}/`);
  assert.match(page.url(), /\/console\/$/, 'GET / leads to the console');
  await page.locator('#login-token').fill(token);
  if (operator) await page.locator('#login-operator').fill(operator);
  await page.locator('#login-form button[type=submit]').click();
  await page.locator('#node-name').filter({ hasText: node.name }).waitFor();
}

function shot(page, name, locator) {
  mkdirSync(SHOTS, { recursive: true });
  const path = join(SHOTS, `${name}.png`);
  return locator ? locator.screenshot({ path }) : page.screenshot({ path, clip: { x: 0, y: 0, width: 1280, height: 640 } });
}

test('an operator sees, explains and steers the limits; hostile names stay text; a read-only token changes nothing', async (t) => {
  const node = await startNode(RULES);
  t.after(() => node.stop());
  const browser = await launch(t);
  const errors = [];
  const page = await newPage(browser, errors);
  const adminCalls = [];
  page.on('request', (r) => {
    if (new URL(r.url()).pathname.startsWith('/v1/admin/')) adminCalls.push({ url: r.url(), headers: r.headers() });
  });

  // Log in: the header names the node serving the page, its store and where its rules came from.
  await login(page, node, node.adminToken, 'alice on call');
  await assert.doesNotReject(page.locator('#node-store').filter({ hasText: 'memory' }).waitFor());
  await page.locator('#rules-source').filter({ hasText: node.rulesFile }).waitFor();
  assert.equal(await page.locator('#node-access').textContent(), 'admin');
  await page.locator('#rules-body tr[data-rule="per-user"]').waitFor();

  // A short load: one client exceeds per-ip (3 an hour); its refusals rise and it tops the list.
  const answers = [];
  for (let i = 0; i < 12; i++) answers.push((await node.check({ ip: '10.0.0.7', user: 'u7' })).allowed);
  assert.deepEqual(answers, [true, true, true, ...Array(9).fill(false)]);
  for (let i = 0; i < 3; i++) await node.check({ ip: `10.0.1.${i}`, user: `u${i}` });
  // A hostile identity refused by the hostile rule (1 an hour).
  assert.equal((await node.check({ ip: '10.0.2.1', user: HOSTILE_ID }, '/hostile')).allowed, true);
  assert.equal((await node.check({ ip: '10.0.2.1', user: HOSTILE_ID }, '/hostile')).allowed, false);
  // An identity that would reorder what follows it is shown with its control written out.
  assert.equal((await node.check({ ip: '10.0.2.2', user: BIDI_ID }, '/hostile')).allowed, true);
  assert.equal((await node.check({ ip: '10.0.2.2', user: BIDI_ID }, '/hostile')).allowed, false);
  const perIp = page.locator('#rules-body tr[data-rule="per-ip"]');
  await perIp.and(page.locator('tr.refusing')).waitFor({ timeout: 10_000 });
  assert.equal(await page.locator('#rules-body tr').first().getAttribute('data-rule'), 'per-ip', 'the refusing rule comes first');
  const denied = await perIp.locator('polyline.denied').getAttribute('points');
  const ys = denied.trim().split(' ').map((p) => Number(p.split(',')[1]));
  assert.ok(Math.min(...ys) < 1, `the denied line reaches the chart's top: ${denied}`);
  const topRow = page.locator('#top-body .top-rule[data-rule="per-ip"] tr').first();
  await topRow.locator('td.identity').filter({ hasText: /^10\.0\.0\.7$/ }).waitFor({ timeout: 10_000 });
  assert.match(await topRow.locator('td.num').textContent(), /^9( ± \d+)?$/);
  await page.locator('#violations-body td.identity').filter({ hasText: '10.0.0.7' }).first().waitFor();
  // The node remembers the store's refusals of 10.0.0.7 and of the hostile identity.
  await page.locator('#node-refusals').filter({ hasText: /^[1-9]\d*$/ }).waitFor({ timeout: 10_000 });
  await shot(page, 'console');

  // Violations filtered by rule and identity.
  await page.locator('#violations-body td.identity').filter({ hasText: HOSTILE_ID }).first().waitFor();
  await page.locator('#violations-rule').fill('per-ip');
  await page.locator('#violations-identity').fill('10.0.0.7');
  await page.locator('#violations-form button').click();
  await page.waitForFunction(() => {
    const rows = [...document.querySelectorAll('#violations-body tr')];
    return rows.length > 0 && rows.every((r) => r.children[1]?.textContent === 'per-ip' && r.children[2]?.textContent === '10.0.0.7');
  });
  await page.locator('#violations-rule').fill('');
  await page.locator('#violations-identity').fill('');

  // Explain: an IPv6 client is read as its /64; per-ip matches, the others say why not.
  const explain = page.locator('#explain-form');
  await explain.locator('[name=path]').fill('//api/./orders');
  await explain.locator('[name=ip]').fill('2001:db8::1');
  await explain.locator('button[type=submit]').click();
  await page.locator('#explain-verdict').filter({ hasText: 'Would pass now.' }).waitFor();
  assert.match(await page.locator('#explain-canonical').textContent(), /\/api\/orders/);
  assert.match(await page.locator('#explain-canonical').textContent(), /2001:db8::\/64/);
  const hostileRow = page.locator('#explain-body tr').filter({ has: page.locator('td.name', { hasText: HOSTILE_RULE }) });
  assert.equal(await hostileRow.locator('td').nth(1).textContent(), 'no');
  // The refused client, through its row in the top list: refused now, per-ip's counter empty.
  await topRow.getByRole('button', { name: 'Explain' }).click();
  await page.locator('#explain-verdict').filter({ hasText: 'Would be refused now.' }).waitFor();
  const explained = page.locator('#explain-body tr[data-rule="per-ip"]');
  assert.equal(await explained.locator('td').nth(1).textContent(), 'yes');
  assert.match(await explained.locator('td').last().textContent(), /^0 of 3 left; refuses/);
  await shot(page, 'explain', page.locator('#explain'));
  assert.equal((await node.check({ ip: '10.0.0.7', user: 'u7' })).allowed, false, 'explaining spent nothing');

  // An override: a bad field is named next to it; a good one lets the refused client through.
  const ov = page.locator('#override-form');
  await ov.locator('[name=rule]').fill('no-such-rule');
  await ov.locator('[name=identity]').fill('10.0.0.7');
  await ov.locator('[name=limit]').fill('100');
  await ov.locator('button[type=submit]').click();
  await ov.locator('[data-error-for=rule]').filter({ hasText: /\S/ }).waitFor();
  await ov.locator('[name=rule]').fill('per-ip');
  await ov.locator('button[type=submit]').click();
  const ovRow = page.locator('#overrides-body tr[data-rule="per-ip"][data-identity="10.0.0.7"]');
  await ovRow.waitFor();
  assert.equal(await ov.locator('[data-error-for=rule]').textContent(), '');
  assert.equal((await node.check({ ip: '10.0.0.7', user: 'u7' })).allowed, true, 'the override lets 10.0.0.7 through');
  await ovRow.getByRole('button', { name: 'Remove' }).click();
  await ovRow.waitFor({ state: 'detached' });
  assert.equal((await node.check({ ip: '10.0.0.7', user: 'u7' })).allowed, false, 'refused again once removed');

  // Reset, confirmed in the page: the refused client passes again; the node logs who asked.
  await topRow.getByRole('button', { name: 'Reset…' }).click();
  const confirm = page.locator('#reset-confirm');
  await confirm.waitFor();
  assert.equal(await page.locator('#reset-confirm-rule').textContent(), 'per-ip');
  assert.equal(await page.locator('#reset-confirm-identity').textContent(), '10.0.0.7');
  assert.equal((await node.check({ ip: '10.0.0.7', user: 'u7' })).allowed, false, 'nothing reset before the confirmation');
  await page.locator('#reset-yes').click();
  await page.locator('#reset-done').filter({ hasText: 'Reset' }).waitFor();
  assert.equal((await node.check({ ip: '10.0.0.7', user: 'u7' })).allowed, true, 'the reset client passes again');
  assert.match(node.log(), /alice on call/, 'the node logs who reset');

  // Hostile names are shown as their characters: nothing was injected, nothing ran.
  await page.locator('#rules-body td.name').filter({ hasText: HOSTILE_RULE }).waitFor();
  await page.locator('#top-body td.identity').filter({ hasText: HOSTILE_ID }).waitFor({ timeout: 10_000 });
  const bidi = page.locator('#top-body td.identity').filter({ hasText: 'gnp.exe' }).first();
  await bidi.waitFor({ timeout: 10_000 });
  assert.equal(await bidi.textContent(), '\\u{202e}gnp.exe', 'the bidirectional override is written out');
  await page.locator('#violations-body td.identity').filter({ hasText: HOSTILE_ID }).first().waitFor();
  assert.equal(await page.locator('#top-body .top-rule .name').filter({ hasText: HOSTILE_RULE }).count(), 1);
  const injected = await page.evaluate(() => ({
    img: document.querySelectorAll('img').length,
    b: document.querySelectorAll('main b').length,
    scripts: [...document.scripts].map((s) => s.getAttribute('src')),
    pwned: window.__pwned,
  }));
  assert.deepEqual(injected, { img: 0, b: 0, scripts: ['app.js'], pwned: undefined });

  // The token: in this tab's sessionStorage and the Authorization header only, never a URL
  // or cookie; the operator's name with it.
  const kept = await page.evaluate(() => ({
    session: sessionStorage.getItem('sluice.token'),
    local: localStorage.length,
    cookie: document.cookie,
  }));
  assert.deepEqual(kept, { session: node.adminToken, local: 0, cookie: '' });
  assert.ok(adminCalls.length > 10);
  for (const c of adminCalls) {
    assert.equal(c.headers.authorization, `Bearer ${node.adminToken}`, c.url);
    assert.equal(c.headers['x-sluice-operator'], 'alice on call', c.url);
    assert.ok(!c.url.includes(node.adminToken), c.url);
  }

  // A read-only token: the same page, reset disabled, a change refused with the node's 403.
  const ro = await newPage(browser, errors);
  await login(ro, node, node.readToken);
  await ro.locator('#node-access').filter({ hasText: 'read-only' }).waitFor();
  await ro.locator('#rules-body tr[data-rule="per-ip"]').waitFor();
  assert.equal(await ro.locator('#reset-form button[type=submit]').isDisabled(), true);
  await ro.locator('#top-body .top-rule[data-rule="per-ip"] button.reset').first().waitFor();
  assert.equal(await ro.locator('#top-body .top-rule[data-rule="per-ip"] button.reset').first().isDisabled(), true);
  const roOv = ro.locator('#override-form');
  await roOv.locator('[name=rule]').fill('per-ip');
  await roOv.locator('[name=identity]').fill('10.0.0.8');
  await roOv.locator('[name=limit]').fill('50');
  await roOv.locator('button[type=submit]').click();
  await roOv.locator('.error').filter({ hasText: /403.*read-only/ }).waitFor();
  await shot(ro, 'read-only', ro.locator('#overrides'));
  const [status, list] = await node.adminApi('GET', '/v1/admin/overrides');
  assert.equal(status, 200);
  assert.deepEqual(list.overrides, [], 'the read-only token changed nothing');

  assert.deepEqual(errors, []);
});

test('the page weighs at most 150 KB and renders 1,000 rules in under a second', async (t) => {
  let rules = '';
  for (let i = 0; i < 1000; i++) {
    rules += `[[rule]]\nname = "rule-${String(i).padStart(4, '0')}"\nby = "ip"\npath = "/r${i}/*"\nalgorithm = "fixed_window"\nlimit = ${10 + i}\nwindow = "1m"\n\n`;
  }
  const node = await startNode(rules, { name: 'thousand-rules' });
  t.after(() => node.stop());

  // The weight as the node serves it: the three files, compiled into the binary.
  let bytes = 0;
  for (const f of ['', 'app.js', 'app.css']) {
    const res = await fetch(`${node.admin}/console/${f}`);
    assert.equal(res.status, 200, f);
    assert.match(res.headers.get('content-security-policy') ?? '', /default-src 'self'/);
    const body = Buffer.from(await res.arrayBuffer());
    assert.deepEqual(body, readFileSync(join(ROOT, 'service/console', f || 'index.html')), `${f} as in the tree`);
    bytes += body.length;
  }
  t.diagnostic(`the page weighs ${(bytes / 1024).toFixed(1)} KB (index.html, app.js, app.css)`);
  assert.ok(bytes <= 150 * 1024, `${bytes} bytes`);

  const browser = await launch(t);
  const errors = [];
  const page = await newPage(browser, errors);
  await login(page, node, node.adminToken);
  await page.waitForFunction(() => window.__sluiceConsole.renders.length >= 2);
  const renders = await page.evaluate(() => window.__sluiceConsole.renders);
  assert.equal(await page.locator('#rules-body tr').count(), 1000);
  const [first, second] = renders;
  assert.equal(first.rules, 1000);
  assert.ok(first.first);
  // Measured in the page around the render (rows built and laid out), not the page's load.
  t.diagnostic(`1,000 rules: first render ${first.ms.toFixed(0)} ms, refresh ${second.ms.toFixed(0)} ms`);
  assert.ok(first.ms < 1000, `the first render of 1,000 rules took ${first.ms.toFixed(0)} ms`);
  assert.deepEqual(errors, []);
});
