// Sluice's operator console (issue 43): plain JS, no build step, no dependency.
// Every value from the node is shown with textContent or an attribute setter, never parsed
// as HTML: a rule named `<img src=x onerror=alert(1)>` shows as those characters.
'use strict';

(() => {
  const POLL_MS = 2000;
  const SVG = 'http://www.w3.org/2000/svg';
  const SERIES = ['allowed', 'denied', 'shadow_denied', 'failure'];
  const store = window.sessionStorage;
  const $ = (id) => document.getElementById(id);

  const state = {
    token: store.getItem('sluice.token') || '',
    operator: store.getItem('sluice.operator') || '',
    access: null,
    rows: new Map(), // rule name -> row of the rules table, reused on every refresh
    rulesSig: '',
    timer: null,
    polling: false,
    firstRender: true,
  };
  // What the browser test reads: how long the first render of the rules took.
  window.__sluiceConsole = { renders: [] };

  // ---- small DOM helpers (text only) ----
  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }
  // Text as sluice-core's text::visible shows it: control, bidirectional and invisible
  // format characters written out as \u{…}, so an identity like '\u202Egnp.exe' cannot
  // pass for 'exe.png' nor reorder what follows it.
  const HIDDEN = /[\u0000-\u001f\u007f-\u009f\u061c\u200b-\u200f\u202a-\u202e\u2060-\u2069\ufeff]/g;
  function shown(text) {
    return String(text).replace(HIDDEN, (c) => `\\u{${c.codePointAt(0).toString(16)}}`);
  }
  function td(text, cls) {
    return el('td', cls, text === undefined || text === null ? text : shown(text));
  }
  function clear(node) {
    while (node.firstChild) node.removeChild(node.firstChild);
  }
  function fmtRate(x) {
    if (!x) return '0';
    if (x >= 100) return x.toFixed(0);
    if (x >= 10) return x.toFixed(1);
    return x.toFixed(2);
  }
  function fmtMs(ms) {
    if (ms < 1000) return `${ms} ms`;
    const s = ms / 1000;
    if (s < 120) return `${s % 1 ? s.toFixed(1) : s} s`;
    if (s < 7200) return `${Math.round(s / 60)} min`;
    if (s < 172800) return `${Math.round(s / 3600)} h`;
    return `${Math.round(s / 86400)} d`;
  }
  function fmtTime(ms) {
    const d = new Date(ms);
    return Number.isFinite(d.getTime()) ? d.toLocaleString() : String(ms);
  }
  function ago(ms) {
    const d = Date.now() - ms;
    return d < 0 ? 'just now' : `${fmtMs(Math.max(0, Math.round(d / 1000) * 1000))} ago`;
  }

  // ---- the API ----
  class ApiError extends Error {
    constructor(status, body) {
      super((body && body.error) || `HTTP ${status}`);
      this.status = status;
      this.field = body && typeof body.field === 'string' ? body.field : '';
    }
  }

  async function api(method, path, body) {
    const headers = { Authorization: `Bearer ${state.token}` };
    if (state.operator) headers['X-Sluice-Operator'] = state.operator;
    if (body !== undefined) headers['Content-Type'] = 'application/json';
    const res = await fetch(path, {
      method,
      headers,
      body: body === undefined ? undefined : JSON.stringify(body),
      cache: 'no-store',
      credentials: 'omit',
    });
    let data = null;
    try {
      data = await res.json();
    } catch {
      data = null;
    }
    if (res.status === 401) {
      logout('The node refused this token (401). Log in again.');
      throw new ApiError(401, data);
    }
    if (!res.ok) throw new ApiError(res.status, data);
    return data;
  }

  // ---- banner and login ----
  function banner(text) {
    const b = $('banner');
    b.textContent = text || '';
    b.hidden = !text;
  }

  function showLogin(message) {
    $('login').hidden = false;
    $('console').hidden = true;
    $('node').hidden = true;
    $('logout').hidden = true;
    $('login-error').textContent = message || '';
    $('login-operator').value = state.operator;
    $('login-token').focus();
  }

  function logout(message) {
    store.removeItem('sluice.token');
    state.token = '';
    stopPolling();
    showLogin(message);
  }

  $('login-form').addEventListener('submit', (e) => {
    e.preventDefault();
    state.token = $('login-token').value.trim();
    state.operator = $('login-operator').value.trim();
    $('login-token').value = '';
    if (!state.token) return;
    store.setItem('sluice.token', state.token);
    store.setItem('sluice.operator', state.operator);
    start();
  });
  $('logout').addEventListener('click', () => logout(''));

  function start() {
    $('login').hidden = true;
    $('console').hidden = false;
    $('logout').hidden = false;
    refresh();
    startPolling();
  }

  // ---- polling: every 2 s while the tab is visible ----
  function startPolling() {
    stopPolling();
    state.timer = setInterval(() => {
      if (document.visibilityState === 'visible') refresh();
    }, POLL_MS);
  }
  function stopPolling() {
    if (state.timer) clearInterval(state.timer);
    state.timer = null;
  }
  document.addEventListener('visibilitychange', () => {
    if (document.visibilityState === 'visible' && state.token && state.timer) refresh();
  });

  let lastOk = 0;
  async function refresh() {
    if (state.polling || !state.token) return;
    state.polling = true;
    try {
      const vf = violationsFilter();
      const [node, rules, top, violations, overrides] = await Promise.all([
        api('GET', '/v1/admin/node'),
        api('GET', '/v1/admin/rules/status'),
        api('GET', '/v1/admin/top'),
        api('GET', `/v1/admin/violations?${vf}`),
        api('GET', '/v1/admin/overrides'),
      ]);
      renderNode(node, rules);
      renderRules(rules);
      renderTop(top);
      renderViolations(violations);
      renderOverrides(overrides);
      lastOk = Date.now();
      banner('');
    } catch (e) {
      if (e.status === 401) return;
      const since = lastOk ? ` Showing what it said ${ago(lastOk)}.` : '';
      banner(`Cannot read the node: ${e.message}.${since}`);
    } finally {
      state.polling = false;
    }
  }

  // ---- header ----
  function renderNode(node, rules) {
    $('node').hidden = false;
    $('node-name').textContent = `${node.node} (v${node.version})`;
    $('node-store').textContent = node.store;
    $('node-refusals').textContent = String(node.refusals_remembered ?? 0);
    $('rules-version').textContent = `version ${rules.version}`;
    const src = rules.source || {};
    const what = src.kind === 'file' ? `file ${src.detail}` : src.kind === 'admin' ? 'admin API' :
      src.kind === 'pubsub' ? 'another node (pub/sub)' : src.kind === 'none' ? 'no rules file' : String(src.kind);
    $('rules-source').textContent = `${what}, ${src.at_ms ? ago(src.at_ms + Date.now() - rules.now_ms) : '?'}`;
    $('rules-source').title = src.at_ms ? fmtTime(src.at_ms) : '';
    const ro = node.access !== 'admin';
    $('node-access').textContent = ro ? 'read-only' : 'admin';
    $('node-access').className = ro ? 'readonly' : '';
    $('updated').textContent = new Date().toLocaleTimeString();
    if (state.access !== node.access) {
      state.access = node.access;
      // The node decides: a read-only token's change is refused (403) and the page shows
      // the answer; reset, the one change that cannot be undone, is disabled outright.
      for (const b of document.querySelectorAll('#reset-form button, #top-body button.reset')) b.disabled = ro;
      for (const n of document.querySelectorAll('.readonly-note')) n.hidden = !ro;
    }
  }

  // ---- rules in force, a chart per rule ----
  function ruleScore(r) {
    // The refusals over the last few buckets: refusing rules come first.
    const d = r.rates.denied || [];
    let s = 0;
    for (let i = Math.max(0, d.length - 6); i < d.length; i++) s += d[i] || 0;
    return s;
  }

  // One row built once and cloned for each rule: cloning is cheaper than building.
  const CELLS = ['name', 'by', 'limit', 'match', 'policy', 'chart', 'now'];
  let protoRow = null;
  function makeRow(name) {
    if (!protoRow) {
      protoRow = document.createElement('tr');
      for (const c of CELLS) protoRow.appendChild(document.createElement('td'));
      protoRow.firstChild.className = 'name';
      const svg = document.createElementNS(SVG, 'svg');
      svg.setAttribute('class', 'spark');
      svg.setAttribute('preserveAspectRatio', 'none');
      svg.setAttribute('role', 'img');
      svg.appendChild(document.createElementNS(SVG, 'title'));
      for (const s of SERIES) {
        const p = document.createElementNS(SVG, 'polyline');
        p.setAttribute('class', s);
        svg.appendChild(p);
      }
      protoRow.children[CELLS.indexOf('chart')].appendChild(svg);
    }
    const tr = protoRow.cloneNode(true);
    const cells = {};
    CELLS.forEach((c, i) => (cells[c] = tr.children[i]));
    const svg = cells.chart.firstChild;
    const lines = {};
    SERIES.forEach((s, i) => (lines[s] = svg.childNodes[i + 1]));
    tr.dataset.rule = name;
    return { tr, cells, svg, title: svg.firstChild, lines, sig: '' };
  }

  // The points of a series of n zeros (most rules' most series), made once per n.
  const flats = new Map();
  function flatLine(n) {
    let pts = flats.get(n);
    if (pts === undefined) {
      pts = '';
      for (let i = 0; i < n; i++) pts += `${i},19.5 `;
      flats.set(n, pts);
    }
    return pts;
  }

  function updateRow(row, r, step) {
    const rates = r.rates;
    const n = (rates.allowed || []).length;
    const sig = JSON.stringify([r.by, r.algorithm, r.limit, r.window_ms, r.match, r.shadow, r.failure, r.overrides]);
    if (sig !== row.sig) {
      row.sig = sig;
      row.cells.name.textContent = r.name;
      row.cells.by.textContent = r.by;
      // A concurrency rule limits requests at once; its window is how long a dead holder's slot lasts.
      row.cells.limit.textContent = r.algorithm === 'concurrency'
        ? `${r.limit} at once (slots outlive a holder ${fmtMs(r.window_ms)}) concurrency`
        : `${r.limit} / ${fmtMs(r.window_ms)} ${r.algorithm}`;
      row.cells.match.textContent = r.match;
      // A cell too narrow ends in an ellipsis: its whole text on hover.
      row.cells.name.title = r.name;
      row.cells.limit.title = row.cells.limit.textContent;
      row.cells.match.title = r.match;
      const policy = [];
      if (r.shadow) policy.push('shadow');
      policy.push(`fail ${r.failure}`);
      if (r.overrides) policy.push(`${r.overrides} override${r.overrides === 1 ? '' : 's'}`);
      row.cells.policy.textContent = policy.join(', ');
    }
    let max = 0;
    for (const s of SERIES) for (const v of rates[s] || []) if (v > max) max = v;
    const top = max > 0 ? max : 1;
    const w = Math.max(1, n - 1);
    row.svg.setAttribute('viewBox', `0 0 ${w} 20`);
    for (const s of SERIES) {
      const vals = rates[s] || [];
      let pts = flatLine(vals.length);
      if (vals.some((v) => v > 0)) {
        pts = '';
        for (let i = 0; i < vals.length; i++) pts += `${i},${Math.round((19.5 - (vals[i] / top) * 19) * 100) / 100} `;
      }
      if (row.lines[s].getAttribute('points') !== pts) row.lines[s].setAttribute('points', pts);
    }
    const last = (s) => (rates[s] && rates[s].length ? rates[s][rates[s].length - 1] : 0);
    row.title.textContent = `${r.name}: peak ${fmtRate(max)}/s over ${fmtMs(n * step * 1000)}`;
    const now = `${fmtRate(last('allowed'))} ok · ${fmtRate(last('denied'))} denied` +
      (last('shadow_denied') ? ` · ${fmtRate(last('shadow_denied'))} shadow` : '') +
      (last('failure') ? ` · ${fmtRate(last('failure'))} failure` : '');
    if (row.cells.now.textContent !== now) row.cells.now.textContent = now;
    const refusing = ruleScore(r) > 0;
    row.tr.classList.toggle('refusing', refusing);
    row.tr.classList.toggle('shadow', !!r.shadow);
  }

  function renderRules(status) {
    const t0 = performance.now();
    const body = $('rules-body');
    const rules = status.rules || [];
    $('rules-count').textContent = `(${rules.length})`;
    $('rules-span').textContent = fmtMs(status.points * status.step_s * 1000);
    const order = rules.map((r, i) => ({ r, i, s: ruleScore(r) }));
    order.sort((a, b) => (b.s > 0) - (a.s > 0) || (b.s - a.s) || (a.i - b.i));
    const seen = new Set();
    const frag = document.createDocumentFragment();
    const filter = $('rules-filter').value.trim().toLowerCase();
    for (const { r } of order) {
      let row = state.rows.get(r.name);
      if (!row) {
        row = makeRow(r.name);
        state.rows.set(r.name, row);
      }
      seen.add(r.name);
      updateRow(row, r, status.step_s);
      row.tr.hidden = filter !== '' && !r.name.toLowerCase().includes(filter);
      frag.appendChild(row.tr);
    }
    for (const [name, row] of state.rows) {
      if (!seen.has(name)) {
        row.tr.remove();
        state.rows.delete(name);
      }
    }
    body.appendChild(frag);
    // The names for the forms' suggestions, rebuilt only when the rules change.
    const sig = rules.map((r) => r.name).join('\n');
    if (sig !== state.rulesSig) {
      state.rulesSig = sig;
      const list = $('rule-names');
      const f = document.createDocumentFragment();
      for (const r of rules) {
        const o = document.createElement('option');
        o.value = r.name;
        f.appendChild(o);
      }
      clear(list);
      list.appendChild(f);
    }
    // Layout inside the measured span: the time is the time until the rows can be shown.
    void body.offsetHeight;
    const ms = performance.now() - t0;
    window.__sluiceConsole.renders.push({ rules: rules.length, ms, first: state.firstRender });
    state.firstRender = false;
  }
  $('rules-filter').addEventListener('input', () => {
    const f = $('rules-filter').value.trim().toLowerCase();
    for (const [name, row] of state.rows) row.tr.hidden = f !== '' && !name.toLowerCase().includes(f);
  });

  // ---- top refused identities ----
  function renderTop(top) {
    const box = $('top-body');
    const frag = document.createDocumentFragment();
    const rules = (top.rules || []).slice().sort((a, b) => b.refused - a.refused);
    if (!rules.length) frag.appendChild(el('p', 'hint', 'No refusals since this node started.'));
    const ro = state.access !== 'admin';
    for (const r of rules) {
      const div = el('div', 'top-rule');
      div.dataset.rule = r.rule;
      const h = el('h3', null);
      h.appendChild(el('span', 'name', r.rule));
      h.appendChild(el('span', 'count', ` ${r.refused} refused`));
      div.appendChild(h);
      const table = el('table');
      const tb = table.appendChild(document.createElement('tbody'));
      for (const id of r.identities || []) {
        const tr = tb.appendChild(document.createElement('tr'));
        tr.dataset.identity = id.identity;
        tr.appendChild(td(id.identity, 'identity'));
        tr.appendChild(td(id.error ? `${id.refused} ± ${id.error}` : String(id.refused), 'num'));
        const actions = tr.appendChild(td());
        const ex = el('button', null, 'Explain');
        ex.type = 'button';
        ex.addEventListener('click', () => explainIdentity(r.rule, id.identity));
        actions.appendChild(ex);
        const rs = el('button', 'reset', 'Reset…');
        rs.type = 'button';
        rs.disabled = ro;
        rs.addEventListener('click', () => askReset(r.rule, id.identity));
        actions.appendChild(rs);
      }
      div.appendChild(table);
      frag.appendChild(div);
    }
    clear(box);
    box.appendChild(frag);
  }

  // ---- violations ----
  function violationsFilter() {
    const p = new URLSearchParams();
    const rule = $('violations-rule').value.trim();
    const identity = $('violations-identity').value.trim();
    if (rule) p.set('rule', rule);
    if (identity) p.set('identity', identity);
    p.set('count', '100');
    return p.toString();
  }
  $('violations-form').addEventListener('submit', (e) => {
    e.preventDefault();
    refresh();
  });
  function renderViolations(v) {
    const body = $('violations-body');
    const frag = document.createDocumentFragment();
    const list = v.violations || [];
    if (!list.length) {
      const tr = frag.appendChild(document.createElement('tr'));
      const c = tr.appendChild(td('None.', 'hint'));
      c.colSpan = 5;
    }
    for (const x of list) {
      const tr = frag.appendChild(document.createElement('tr'));
      const when = tr.appendChild(td(new Date(x.at_ms).toLocaleTimeString()));
      when.title = fmtTime(x.at_ms);
      tr.appendChild(td(x.rule, 'name'));
      tr.appendChild(td(x.identity, 'identity'));
      tr.appendChild(td(x.cost, 'num'));
      tr.appendChild(td(x.path));
    }
    clear(body);
    body.appendChild(frag);
    $('violations-dropped').textContent = v.dropped ? `${v.dropped} not logged (the log fell behind)` : '';
  }

  // ---- overrides ----
  function renderOverrides(o) {
    const body = $('overrides-body');
    const frag = document.createDocumentFragment();
    const list = o.overrides || [];
    if (!list.length) {
      const tr = frag.appendChild(document.createElement('tr'));
      tr.appendChild(td('None.', 'hint')).colSpan = 5;
    }
    for (const x of list) {
      const tr = frag.appendChild(document.createElement('tr'));
      tr.dataset.rule = x.rule;
      tr.dataset.identity = x.identity;
      tr.appendChild(td(x.rule, 'name'));
      tr.appendChild(td(x.identity, 'identity'));
      tr.appendChild(td(x.limit, 'num'));
      const until = tr.appendChild(td(x.until));
      if (x.until_ms) until.title = `in ${fmtMs(Math.max(0, x.until_ms - Date.now()))}`;
      const b = el('button', null, 'Remove');
      b.type = 'button';
      b.addEventListener('click', () => removeOverride(x.rule, x.identity, b));
      tr.appendChild(td()).appendChild(b);
    }
    clear(body);
    body.appendChild(frag);
  }

  function formErrors(form, err) {
    for (const s of form.querySelectorAll('[data-error-for]')) s.textContent = '';
    if (!err) return;
    const msg = err.status === 403 ? `Refused (403): ${err.message}` : err.message;
    let target = null;
    for (const s of form.querySelectorAll('[data-error-for]')) {
      if (err.field && s.dataset.errorFor === err.field) target = s;
    }
    if (!target) target = form.querySelector('[data-error-for=""]');
    target.textContent = msg;
  }

  function rfc3339(ms) {
    return new Date(ms).toISOString().replace(/\.\d{3}Z$/, 'Z');
  }
  const ovForm = $('override-form');
  ovForm.elements.until.value = rfc3339(Date.now() + 3600_000);
  for (const b of ovForm.querySelectorAll('[data-until]')) {
    b.addEventListener('click', () => {
      ovForm.elements.until.value = rfc3339(Date.now() + Number(b.dataset.until) * 1000);
    });
  }
  ovForm.addEventListener('submit', async (e) => {
    e.preventDefault();
    const f = ovForm.elements;
    const limit = Number(f.limit.value);
    const body = { rule: f.rule.value, identity: f.identity.value, limit, until: f.until.value.trim() };
    formErrors(ovForm, null);
    try {
      await api('POST', '/v1/admin/overrides', body);
      f.identity.value = '';
      f.limit.value = '';
      refresh();
    } catch (err) {
      formErrors(ovForm, err);
    }
  });

  async function removeOverride(rule, identity, button) {
    const p = new URLSearchParams({ rule, identity });
    button.disabled = true;
    try {
      await api('DELETE', `/v1/admin/overrides?${p}`);
      formErrors(ovForm, null);
      refresh();
    } catch (err) {
      button.disabled = false;
      formErrors(ovForm, err);
    }
  }

  // ---- explain ----
  const exForm = $('explain-form');
  exForm.addEventListener('submit', async (e) => {
    e.preventDefault();
    const f = exForm.elements;
    const body = { method: f.method.value.trim() || 'GET', path: f.path.value };
    if (f.host.value.trim()) body.host = f.host.value.trim();
    if (f.ip.value.trim()) body.ip = f.ip.value.trim();
    const ids = {};
    for (const line of f.identities.value.split('\n')) {
      const i = line.indexOf('=');
      if (i > 0) ids[line.slice(0, i).trim()] = line.slice(i + 1).trim();
    }
    if (Object.keys(ids).length) body.identities = ids;
    formErrors(exForm, null);
    try {
      renderExplain(await api('POST', '/v1/admin/explain', body));
    } catch (err) {
      formErrors(exForm, err);
    }
  });

  function explainIdentity(rule, identity) {
    // Fills the form from a refused identity: its rule's `by` names the identity.
    const row = state.rows.get(rule);
    const by = row ? row.cells.by.textContent : '';
    const f = exForm.elements;
    if (by === 'ip') {
      f.ip.value = identity;
      f.identities.value = '';
    } else if (by) {
      f.ip.value = '';
      f.identities.value = `${by}=${identity}`;
    }
    exForm.requestSubmit();
    $('explain').scrollIntoView();
  }

  function renderExplain(x) {
    $('explain-result').hidden = false;
    const v = $('explain-verdict');
    v.textContent = x.would_pass ? 'Would pass now.' : 'Would be refused now.';
    v.className = `verdict ${x.would_pass ? 'pass' : 'refuse'}`;
    const dl = $('explain-canonical');
    clear(dl);
    const fact = (k, val) => {
      const d = dl.appendChild(document.createElement('div'));
      d.appendChild(el('dt', null, k));
      d.appendChild(el('dd', null, val));
    };
    fact('path', x.path);
    if (x.host !== undefined && x.host !== null) fact('host', x.host);
    for (const [k, val] of Object.entries(x.identities || {})) fact(k, val);
    const body = $('explain-body');
    const frag = document.createDocumentFragment();
    for (const r of x.rules || []) {
      const tr = frag.appendChild(document.createElement('tr'));
      tr.dataset.rule = r.rule;
      tr.className = r.matches ? (r.state && !r.state.would_pass ? 'refusing' : 'matches') : 'nomatch';
      tr.appendChild(td(r.rule, 'name'));
      tr.appendChild(td(r.matches ? (r.shadow ? 'yes (shadow)' : 'yes') : 'no'));
      tr.appendChild(td(r.why));
      tr.appendChild(td(r.identity === null || r.identity === undefined ? '–' : r.identity, 'identity'));
      tr.appendChild(td(`${r.limit}${r.override ? ' (override)' : ''}`, 'num'));
      const s = r.state;
      const verdict = s && (s.would_pass ? 'passes' : `refuses, retry after ${fmtMs(s.retry_after_ms)}`);
      tr.appendChild(td(!s ? '–' : r.algorithm === 'concurrency'
        ? `${s.remaining} of ${s.limit} slots free; ${verdict}`
        : `${s.remaining} of ${s.limit} left; ${verdict}; full in ${fmtMs(s.reset_after_ms)}`));
    }
    clear(body);
    body.appendChild(frag);
  }

  // ---- reset, confirmed in the page ----
  const rsForm = $('reset-form');
  let pending = null;
  function askReset(rule, identity) {
    rsForm.elements.rule.value = rule;
    rsForm.elements.identity.value = identity;
    rsForm.requestSubmit();
    $('reset').scrollIntoView();
  }
  rsForm.addEventListener('submit', (e) => {
    e.preventDefault();
    formErrors(rsForm, null);
    $('reset-done').textContent = '';
    pending = { rule: rsForm.elements.rule.value, identity: rsForm.elements.identity.value };
    $('reset-confirm-rule').textContent = pending.rule;
    $('reset-confirm-identity').textContent = shown(pending.identity);
    $('reset-confirm').hidden = false;
    $('reset-yes').disabled = state.access !== 'admin';
    $('reset-yes').focus();
  });
  $('reset-no').addEventListener('click', () => {
    pending = null;
    $('reset-confirm').hidden = true;
  });
  $('reset-yes').addEventListener('click', async () => {
    if (!pending) return;
    const what = pending;
    pending = null;
    $('reset-confirm').hidden = true;
    try {
      await api('POST', '/v1/admin/reset', what);
      $('reset-done').textContent = `Reset: rule ${shown(what.rule)}, identity ${shown(what.identity)}.`;
      refresh();
    } catch (err) {
      formErrors(rsForm, err);
    }
  });

  if (state.token) start();
  else showLogin('');
})();
