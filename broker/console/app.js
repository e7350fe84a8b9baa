// Narad console: one page, no dependencies. Everything it shows or changes goes through the
// broker's /v1 API on this origin, with the credentials the browser already holds (HTTP Basic).
// It never consumes: the message browser reads by partition and offset (replay, no lease).
'use strict';
(() => {
  // Requests go to the origin, never relative to the page: a page opened as
  // http://user:password@host/ui would make every relative URL carry the credentials, which
  // fetch refuses.
  const ORIGIN = location.origin;
  const REFRESH_MS = 5000;
  const main = document.getElementById('main');
  const flashBox = document.getElementById('flash');

  // ---- DOM helpers (text only: nothing from the API is ever parsed as HTML) ----
  function h(tag, attrs, ...kids) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v == null || v === false) continue;
      if (k.startsWith('on')) el.addEventListener(k.slice(2), v);
      else if (k === 'class') el.className = v;
      else el.setAttribute(k, v === true ? '' : String(v));
    }
    for (const kid of kids.flat(Infinity)) {
      if (kid == null || kid === false) continue;
      el.append(kid instanceof Node ? kid : String(kid));
    }
    return el;
  }
  const td = (v, cls) => h('td', { class: cls }, v == null ? '—' : v);
  const num = (v) => td(v == null ? null : Number(v).toLocaleString('en'), 'num');
  function table(headers, rows, empty) {
    if (!rows.length) return h('p', { class: 'muted' }, empty || 'None.');
    return h('table', {},
      h('thead', {}, h('tr', {}, headers.map((x) =>
        h('th', { class: x.endsWith('#') ? 'num' : null }, x.replace(/#$/, ''))))),
      h('tbody', {}, rows));
  }
  function fill(el, ...kids) { el.replaceChildren(...kids.flat(Infinity).filter((k) => k != null)); }

  // A message is cleared by the next navigation, unless its own action navigates (`keep`).
  let keepFlash = false;
  function flash(message, kind, keep) {
    flashBox.className = kind || 'ok';
    flashBox.textContent = message;
    keepFlash = Boolean(keep);
  }
  const fail = (e) => flash(e.status ? `${e.status}: ${e.message}` : String(e.message || e), 'error');

  // ---- formatting ----
  function duration(ms) {
    if (ms == null) return null;
    if (ms === 0) return '0';
    const units = [['d', 86400000], ['h', 3600000], ['m', 60000], ['s', 1000], ['ms', 1]];
    let out = '';
    let rest = ms;
    for (const [u, n] of units) {
      if (rest >= n) { out += Math.floor(rest / n) + u; rest %= n; }
      if (out && out.length > 6) break;
    }
    return out;
  }
  function bytes(n) {
    if (n == null) return null;
    const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
    let i = 0;
    while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
    return (i ? n.toFixed(1) : n) + ' ' + u[i];
  }
  const when = (ms) => (ms ? new Date(ms).toISOString().replace('T', ' ').replace(/\.\d+Z$/, 'Z') : null);
  const age = (s) => (s == null ? null : duration(s * 1000));
  const topicHref = (name) => '#/topics/' + encodeURIComponent(name);
  const topicPath = (name) => '/v1/topics/' + encodeURIComponent(name);

  // ---- the API ----
  class ApiError extends Error {
    constructor(status, message) { super(message); this.status = status; }
  }
  async function api(method, path, body, raw) {
    const init = { method, headers: {}, credentials: 'same-origin', cache: 'no-store' };
    if (body !== undefined) {
      init.body = raw ? body : JSON.stringify(body);
      init.headers['Content-Type'] = raw ? 'text/plain; charset=utf-8' : 'application/json';
    }
    const r = await fetch(ORIGIN + path, init);
    const text = r.status === 204 ? '' : await r.text();
    let data = null;
    if (text) { try { data = JSON.parse(text); } catch (_) { data = text; } }
    if (!r.ok) throw new ApiError(r.status, (data && data.error) || r.statusText || 'request failed');
    return { status: r.status, data };
  }
  const get = async (path) => (await api('GET', path)).data;

  // ---- pages, routing, refresh ----
  let page = 0; // bumped on every navigation: a late answer for an old page is dropped
  let timer = null;
  function every(fn) {
    const mine = page;
    const tick = async () => {
      if (mine !== page) return;
      try { await fn(mine); stamp(); } catch (e) { if (mine === page) fail(e); }
    };
    timer = setInterval(() => { if (document.visibilityState === 'visible') tick(); }, REFRESH_MS);
    return tick();
  }
  function stamp() {
    document.getElementById('updated').textContent = 'updated ' + new Date().toLocaleTimeString('en-GB');
  }

  function route() {
    clearInterval(timer);
    page++;
    if (!keepFlash) flashBox.replaceChildren();
    keepFlash = false;
    const parts = (location.hash.slice(1) || '/').split('/').filter(Boolean).map(decodeURIComponent);
    const tab = parts[0] || 'cluster';
    for (const a of document.querySelectorAll('nav a')) a.classList.toggle('active', a.id === 'nav-' + tab);
    if (tab === 'topics' && parts[1]) topicPage(parts[1]);
    else if (tab === 'topics') topicsPage();
    else if (tab === 'users') usersPage();
    else clusterPage();
  }

  // ---- cluster ----
  function clusterPage() {
    const health = h('div', { class: 'cards', id: 'health' });
    const members = h('div', { id: 'members' });
    const moves = h('div', { id: 'moves' });
    fill(main, h('h1', {}, 'Cluster'), health,
      h('section', {}, h('h2', {}, 'Members'), members),
      h('section', {}, h('h2', {}, 'Partition moves'), moves));
    return every(async (mine) => {
      const probe = async (p) => {
        const r = await fetch(ORIGIN + p, { cache: 'no-store' });
        const b = await r.json().catch(() => ({}));
        return { ok: r.ok, text: b.status || b.error || String(r.status) };
      };
      const [hz, rz, m, mv] = await Promise.all([probe('/healthz'), probe('/readyz'),
        get('/v1/cluster/members'), get('/v1/cluster/moves')]);
      if (mine !== page) return;
      const card = (label, p) => h('div', { class: 'card' }, h('span', { class: 'muted' }, label),
        h('b', { class: p.ok ? 'ok' : 'bad' }, p.text));
      const alive = m.members.filter((x) => x.status === 'alive').length;
      fill(health, card('This node: health', hz), card('This node: readiness', rz),
        h('div', { class: 'card' }, h('span', { class: 'muted' }, 'Members alive'),
          h('b', { class: alive === m.members.length ? 'ok' : 'warn' }, `${alive} / ${m.members.length}`)));
      fill(members, table(['Member', 'API address', 'Status', 'Role', 'Partitions#', 'Moving out#', 'Version', 'Note'],
        m.members.map((x) => h('tr', {}, td(x.id), td(x.addr),
          td(h('span', { class: x.status === 'alive' ? 'ok' : 'bad' }, x.status)),
          td([x.leader ? h('span', { class: 'badge' }, 'leader') : null,
            x.draining ? h('span', { class: 'badge warn' }, 'draining') : null]),
          num(x.owned_partitions), num(x.outbound_moves), td(x.version),
          td(x.decommission_reason || '')))));
      fill(moves, table(['Topic', 'Partition#', 'From', 'To'], mv.moves.map((x) =>
        h('tr', {}, td(h('a', { href: topicHref(x.topic) }, x.topic)), num(x.partition), td(x.from), td(x.to))),
      'No partition is moving.'));
    });
  }

  // ---- topics ----
  function topicsPage() {
    const list = h('div', { id: 'topic-list' });
    const more = h('div', {});
    const name = h('input', { name: 'name', id: 'new-topic-name', required: true, placeholder: 'orders' });
    const parts = h('input', { name: 'partitions', id: 'new-topic-partitions', class: 'narrow', type: 'number', min: 1, placeholder: 'default' });
    const retention = h('input', { name: 'retention_ms', id: 'new-topic-retention', class: 'narrow', type: 'number', min: 0, placeholder: 'default' });
    const parent = h('input', { name: 'parent', id: 'new-topic-parent', placeholder: 'none' });
    const form = h('form', { id: 'create-topic', onsubmit: async (ev) => {
      ev.preventDefault();
      const body = { name: name.value.trim() };
      if (parts.value) body.partitions = Number(parts.value);
      if (retention.value) body.retention_ms = Number(retention.value);
      if (parent.value.trim()) body.parent = parent.value.trim();
      try {
        const r = await api('POST', '/v1/topics', body);
        flash(`Created topic ${r.data.name} (${r.data.partitions} partitions).`, 'ok', true);
        location.hash = topicHref(r.data.name);
      } catch (e) { fail(e); }
    } },
    h('label', {}, 'Name', name), h('label', {}, 'Partitions', parts),
    h('label', {}, 'Retention (ms, 0 = forever)', retention), h('label', {}, 'Parent (replica child of)', parent),
    h('button', { type: 'submit', id: 'create-topic-submit' }, 'Create topic'));
    fill(main, h('h1', {}, 'Topics'),
      h('section', {}, h('h2', {}, 'Create a topic'), form),
      h('section', {}, h('h2', {}, 'Topics'), list, more));

    let token = '';
    let pages = [''];
    const load = async (mine) => {
      const rows = [];
      for (const t of pages) {
        const q = '?limit=100' + (t ? '&page_token=' + encodeURIComponent(t) : '');
        const l = await get('/v1/topics' + q);
        rows.push(...l.topics);
        token = l.next_page_token;
      }
      // The list has no statistics: each topic's backlog comes from its own GET.
      const stats = await Promise.all(rows.map((t) => get(topicPath(t.name)).catch(() => null)));
      if (mine !== page) return;
      fill(list, table(['Topic', 'Role', 'Partitions#', 'Owner', 'Waiting#', 'In flight#', 'Oldest unacked', 'Children#', 'State'],
        rows.map((t, i) => {
          const b = stats[i] && stats[i].backlog;
          return h('tr', { 'data-topic': t.name }, td(h('a', { href: topicHref(t.name) }, t.name)),
            td(t.role + (t.parent ? ` of ${t.parent}` : '')), num(t.partitions), td(t.owner),
            td(b ? b.messages.toLocaleString('en') : null, 'num backlog'),
            td(b ? b.in_flight.toLocaleString('en') : null, 'num in-flight'),
            td(b ? age(b.oldest_unacked_age_seconds) : null),
            num((t.children || []).length + (t.remote_children || []).length),
            td([t.paused ? h('span', { class: 'badge warn' }, 'paused') : null,
              stats[i] && stats[i].partial ? h('span', { class: 'badge bad' }, 'partial') : null]));
        }), 'No topics yet.'));
      fill(more, token ? h('button', { class: 'secondary', onclick: () => { pages.push(token); load(page); } }, 'More topics') : null);
    };
    return every(load);
  }

  function topicPage(name) {
    const head = h('div', { id: 'topic-head' });
    const cards = h('div', { class: 'cards', id: 'topic-cards' });
    const settings = h('div', {});
    const partitions = h('div', { id: 'partitions' });
    const children = h('div', { id: 'children' });
    const peekOut = h('div', { id: 'peek-result' });
    let record = null;

    // Produce a test message.
    const payload = h('textarea', { id: 'produce-payload', name: 'payload', required: true, placeholder: '{"hello":"world"}' });
    const key = h('input', { id: 'produce-key', name: 'key', placeholder: 'none' });
    const pinned = h('input', { id: 'produce-partition', name: 'partition', class: 'narrow', type: 'number', min: 0, placeholder: 'any' });
    const produce = h('form', { id: 'produce', onsubmit: async (ev) => {
      ev.preventDefault();
      const q = new URLSearchParams();
      if (key.value) q.set('key', key.value);
      if (pinned.value) q.set('partition', pinned.value);
      try {
        await api('POST', topicPath(name) + '/produce' + (q.toString() ? '?' + q : ''), payload.value, true);
        flash(`Message accepted by ${name} (202).`);
        await refresh(page);
      } catch (e) { fail(e); }
    } },
    h('label', {}, 'Payload', payload), h('label', {}, 'Key', key), h('label', {}, 'Partition', pinned),
    h('button', { type: 'submit', id: 'produce-submit' }, 'Produce'));

    // Peek: replay by partition and offset (no lease, no effect on the queue).
    const pPart = h('select', { id: 'peek-partition', name: 'partition' });
    const pFrom = h('input', { id: 'peek-offset', name: 'offset', class: 'narrow', type: 'number', min: 0, placeholder: 'oldest' });
    const pCount = h('input', { id: 'peek-count', name: 'count', class: 'narrow', type: 'number', min: 1, max: 100, value: 20 });
    const peek = h('form', { id: 'peek', onsubmit: async (ev) => {
      ev.preventDefault();
      const p = Number(pPart.value || 0);
      const st = record && record.partition_stats && record.partition_stats.find((s) => s.index === p);
      let offset = pFrom.value !== '' ? Number(pFrom.value) : (st ? st.oldest_offset : 0);
      const count = Math.min(100, Math.max(1, Number(pCount.value) || 20));
      const msgs = [];
      let end = null;
      try {
        while (msgs.length < count) {
          const r = await api('GET', `${topicPath(name)}/consume?partition=${p}&offset=${offset}`);
          if (r.status === 204) { end = 'the high watermark'; break; }
          msgs.push(r.data);
          offset = r.data.offset + 1;
        }
      } catch (e) {
        if (e.status !== 410 || msgs.length) return fail(e);
        end = null;
        fail(new ApiError(410, `${e.message} (oldest retained offset: ${st ? st.oldest_offset : '?'})`));
      }
      pFrom.value = String(offset);
      fill(peekOut, h('p', { class: 'muted' }, `${msgs.length} message${msgs.length === 1 ? '' : 's'} from partition ${p}` +
        (end ? `; reached ${end}` : '') + '. Peeking never leases: the queue is unchanged.'),
      table(['Offset#', 'Committed', 'Key', 'Attributes', 'Payload'], msgs.map((m) => h('tr', { class: 'message' },
        num(m.offset), td(when(m.timestamp * 1000)),
        td(m.key == null ? null : (m.key_encoding ? `base64 ${m.key}` : m.key)),
        td(m.attributes ? Object.entries(m.attributes).map(([k, v]) => h('div', {}, `${k}: ${v}`)) : null),
        td(h('pre', { class: 'payload' }, m.payload_encoding ? `base64 ${m.payload}`
          : typeof m.payload === 'string' ? m.payload : JSON.stringify(m.payload, null, 1)))))));
    } },
    h('label', {}, 'Partition', pPart), h('label', {}, 'From offset', pFrom), h('label', {}, 'Count', pCount),
    h('button', { type: 'submit', id: 'peek-submit' }, 'Peek'));

    // Alter and delete (the API answers 403 to those who may not; the answer is shown).
    const alterFields = [['partitions', 'Partitions (more only)'], ['retention_ms', 'Retention ms'],
      ['visibility_timeout_ms', 'Visibility timeout ms'], ['max_in_flight_per_partition', 'Max in flight / partition'],
      ['max_acked_ahead_per_partition', 'Max acked ahead / partition']]
      .map(([f, l]) => [f, l, h('input', { id: 'alter-' + f, name: f, class: 'narrow', type: 'number', min: 0 })]);
    const alter = h('form', { id: 'alter', onsubmit: async (ev) => {
      ev.preventDefault();
      const body = {};
      for (const [f, , input] of alterFields) if (input.value !== '') body[f] = Number(input.value);
      if (!Object.keys(body).length) return flash('Fill in at least one setting to change.', 'error');
      try {
        await api('PATCH', topicPath(name), body);
        flash(`Changed ${Object.keys(body).join(', ')} of ${name}.`);
        for (const [, , input] of alterFields) input.value = '';
        await refresh(page);
      } catch (e) { fail(e); }
    } }, alterFields.map(([, l, input]) => h('label', {}, l, input)),
    h('button', { type: 'submit', id: 'alter-submit' }, 'Apply'));
    let armed = 0;
    const del = h('button', { type: 'button', class: 'danger', id: 'delete-topic', onclick: async () => {
      if (Date.now() - armed > 5000) {
        armed = Date.now();
        del.textContent = `Click again to delete ${name} and all its messages`;
        return;
      }
      try {
        await api('DELETE', topicPath(name));
        flash(`Deleted topic ${name}.`, 'ok', true);
        location.hash = '#/topics';
      } catch (e) { fail(e); }
    } }, 'Delete topic');

    fill(main, head, cards,
      h('div', { class: 'row' },
        h('section', {}, h('h2', {}, 'Produce a test message'), produce),
        h('section', {}, h('h2', {}, 'Settings'), settings)),
      h('section', {}, h('h2', {}, 'Partitions'), partitions),
      h('section', {}, h('h2', {}, 'Children'), children),
      h('section', {}, h('h2', {}, 'Peek at messages'), peek, peekOut),
      h('section', {}, h('h2', {}, 'Change or delete'), alter, h('p', {}, del)));

    const refresh = async (mine) => {
      const [t, c] = await Promise.all([get(topicPath(name)),
        get(topicPath(name) + '/children').catch((e) => ({ error: e }))]);
      if (mine !== page) return;
      record = t;
      const b = t.backlog || { messages: 0, in_flight: 0, oldest_unacked_age_seconds: 0 };
      fill(head, h('h1', {}, name, ' ', h('span', { class: 'badge' }, t.role),
        t.paused ? h('span', { class: 'badge warn' }, 'paused') : null,
        t.partial ? h('span', { class: 'badge bad' }, 'some owners did not answer') : null),
      t.parent ? h('p', {}, 'Child of ', h('a', { href: topicHref(t.parent) }, t.parent),
        t.fanout_delay_ms ? `, delayed by ${duration(t.fanout_delay_ms)}` : '') : null);
      const card = (label, v, id) => h('div', { class: 'card' }, h('span', { class: 'muted' }, label), h('b', { id }, v));
      const hwm = (t.partition_stats || []).reduce((s, p) => s + p.high_watermark, 0);
      fill(cards, card('Waiting', b.messages.toLocaleString('en'), 'backlog-messages'),
        card('In flight', b.in_flight.toLocaleString('en'), 'backlog-in-flight'),
        card('Oldest unacked', age(b.oldest_unacked_age_seconds) || '0', 'backlog-age'),
        card('Committed (high watermarks)', hwm.toLocaleString('en'), 'high-watermarks'));
      const dl = (pairs) => h('dl', {}, pairs.filter(([, v]) => v != null && v !== '').map(([k, v]) => [h('dt', {}, k), h('dd', {}, v)]));
      fill(settings, dl([['Partitions', t.partitions], ['Owner', t.owner],
        ['Retention', t.retention_ms ? duration(t.retention_ms) : 'forever'],
        ['Visibility timeout', duration(t.visibility_timeout_ms)],
        ['Max in flight / partition', t.max_in_flight_per_partition],
        ['Max acked ahead / partition', t.max_acked_ahead_per_partition],
        ['Retry backoff', t.retry_backoff ? `${t.retry_backoff.min} … ${t.retry_backoff.max}` : null],
        ['Dead letter', t.dead_letter ? `${t.dead_letter.topic} after ${t.dead_letter.max_deliveries} deliveries` : null],
        ['Dedup window', t.dedup_window_ms ? duration(t.dedup_window_ms) : null],
        ['Schema version', t.schema_version || null], ['Created', when(t.created_at)]]));
      const stats = t.partition_stats || [];
      fill(partitions, table(['Partition#', 'Owner', 'Status', 'Oldest offset#', 'High watermark#', 'Next offset#',
        'Segments#', 'Size#', 'Waiting#', 'In flight#', 'Oldest unacked'],
      stats.map((p) => h('tr', {}, num(p.index), td(p.owner_node),
        td(h('span', { class: p.status === 'ok' ? 'ok' : 'bad' }, p.status + (p.owner_liveness ? ` (${p.owner_liveness})` : ''))),
        num(p.oldest_offset), num(p.high_watermark), num(p.next_offset), num(p.segments), td(bytes(p.size_bytes), 'num'),
        num(p.backlog && p.backlog.messages), num(p.backlog && p.backlog.in_flight),
        td(p.backlog ? age(p.backlog.oldest_unacked_age_seconds) : null)))));
      if (pPart.options.length !== t.partitions) {
        fill(pPart, Array.from({ length: t.partitions }, (_, i) => h('option', { value: i }, String(i))));
      }
      fill(children, c.error ? h('p', { class: 'bad' }, `${c.error.status}: ${c.error.message}`)
        : table(['Child', 'Kind', 'Delay', 'Lag#', 'Link', 'Last error'], c.children.map((x) => h('tr', {},
          td(x.kind === 'remote' ? x.name : h('a', { href: topicHref(x.name) }, x.name)),
          td(x.kind + (x.remote ? ` → ${x.remote.url} (${x.remote.topic})` : '')),
          td(x.delay_ms ? duration(x.delay_ms) : null),
          td((x.lag_complete ? '' : '≥ ') + x.lag_messages.toLocaleString('en'), 'num'),
          td(x.state ? h('span', { class: x.state === 'ok' ? 'ok' : x.state === 'blocked' ? 'bad' : 'warn' }, x.state) : 'ok'),
          td(x.last_error || ''))), 'No children.'));
    };
    return every(refresh);
  }

  // ---- users and grants (admins) ----
  // Grants as text: `produce: orders-*, audit; consume: orders-*; admin`.
  const grantsText = (gs) => (gs || []).map((g) => g.action + (g.patterns && g.patterns.length ? ': ' + g.patterns.join(', ') : '')).join('; ');
  function parseGrants(text) {
    return text.split(/[;\n]/).map((s) => s.trim()).filter(Boolean).map((s) => {
      const [action, rest] = s.split(':');
      const patterns = (rest || '').split(',').map((p) => p.trim()).filter(Boolean);
      return patterns.length ? { action: action.trim(), patterns } : { action: action.trim() };
    });
  }
  function usersPage() {
    const list = h('div', { id: 'user-list' });
    const uname = h('input', { id: 'new-user-name', name: 'username', required: true, autocomplete: 'off' });
    const pw = h('input', { id: 'new-user-password', name: 'new-password', type: 'password', required: true, autocomplete: 'new-password' });
    const grants = h('input', { id: 'new-user-grants', name: 'grants', placeholder: 'produce: orders-*; consume: orders' });
    const form = h('form', { id: 'create-user', onsubmit: async (ev) => {
      ev.preventDefault();
      const body = { username: uname.value.trim(), password: pw.value, grants: parseGrants(grants.value) };
      pw.value = ''; // sent once, never kept or shown
      try {
        await api('POST', '/v1/users', body);
        flash(`Created user ${body.username}.`);
        uname.value = ''; grants.value = '';
        await load(page);
      } catch (e) { fail(e); }
    } }, h('label', {}, 'Username', uname), h('label', {}, 'Password', pw),
    h('label', {}, 'Grants', grants), h('button', { type: 'submit', id: 'create-user-submit' }, 'Create user'));
    fill(main, h('h1', {}, 'Users and grants'),
      h('section', {}, h('h2', {}, 'Users'), list),
      h('section', { id: 'create-user-section' }, h('h2', {}, 'Create a user'), form,
        h('p', { class: 'muted' }, 'Grants: action: patterns, separated by “;”. Actions: produce, consume, create (scoped to topic patterns such as orders-*), admin (no patterns).')));
    const load = async (mine) => {
      let users;
      try {
        users = await get('/v1/users');
      } catch (e) {
        if (e.status === 403) {
          fill(list, h('p', { class: 'muted', id: 'users-forbidden' }, 'Users and grants are managed by admins; your user has no admin grant.'));
          document.getElementById('create-user-section').hidden = true;
          return;
        }
        throw e;
      }
      if (mine !== page) return;
      fill(list, table(['User', 'Grants', 'Created', 'Updated', ''], users.map((u) => {
        const edit = h('input', { value: grantsText(u.grants), 'aria-label': `grants of ${u.username}`, size: 40, disabled: u.root });
        let armed = 0;
        const del = h('button', { type: 'button', class: 'danger', disabled: u.root, onclick: async () => {
          if (Date.now() - armed > 5000) { armed = Date.now(); del.textContent = 'Click again to delete'; return; }
          try { await api('DELETE', '/v1/users/' + encodeURIComponent(u.username)); flash(`Deleted user ${u.username}.`); await load(page); } catch (e) { fail(e); }
        } }, 'Delete');
        const save = h('button', { type: 'button', class: 'secondary', disabled: u.root, onclick: async () => {
          try {
            await api('PUT', `/v1/users/${encodeURIComponent(u.username)}/grants`, { grants: parseGrants(edit.value) });
            flash(`Saved the grants of ${u.username}.`);
            await load(page);
          } catch (e) { fail(e); }
        } }, 'Save grants');
        return h('tr', { 'data-user': u.username }, td([u.username, u.root ? h('span', { class: 'badge' }, 'root') : null]),
          td(edit), td(when(u.created_at_ms)), td(when(u.updated_at_ms)), td([save, ' ', del]));
      }), 'No users (security is off).'));
    };
    // Users change rarely and the grant fields are edited in place: no periodic refresh.
    return load(page).then(stamp).catch(fail);
  }

  window.addEventListener('hashchange', route);
  route();
})();
