// KV: the namespaces, a prefix browser (key, value, version, expiry) and get/put/delete of one key.
import { useState } from 'preact/hooks';
import { get, post } from '../api.js';
import { act, Danger, Empty, ErrorLine, fmt, html, Json, link, usePoll, useAuth, Write } from '../ui.js';

const PAGE = 50;
const kv = async (op) => {
  const r = await post('kv', { operations: [op] });
  return r.results[0];
};

export function Kv({ query, nav }) {
  const ns = query.ns || '';
  const prefix = query.prefix || '';
  const after = query.after || '';
  const names = usePoll(() => get('kv/namespaces', { limit: 200 }), []);
  const page = usePoll(() => (ns ? get('kv/keys', { ns, prefix, after, limit: PAGE }) : Promise.resolve(null)),
    [ns, prefix, after]);
  const [text, setText] = useState(prefix);
  const [trail, setTrail] = useState([]); // the `after` of each earlier page, for Prev
  return html`
    <h2>KV <small>${ns ? `namespace ${ns}` : ''}</small></h2>
    <div class="row">
      <div class="panel side"><h3>Namespaces</h3>
        <${ErrorLine} error=${names.error} />
        <ul data-testid="kv-namespaces">${(names.data ? names.data.namespaces : []).map((n) => html`<li key=${n}>
          <a class=${n === ns ? 'on' : ''} href=${link('/kv', { ns: n })}>${n}</a></li>`)}</ul>
        ${names.data && names.data.namespaces.length === 0 && html`<${Empty}>No key yet.</${Empty}>`}
        ${names.data && names.data.truncated && html`<div class="muted small">first 200 shown</div>`}
      </div>
      <div>
        ${ns && html`<div class="panel"><h3>Keys</h3>
          <form class="filters" onSubmit=${(e) => { e.preventDefault(); setTrail([]); nav({ prefix: text, after: '' }); }}>
            <label>Prefix<input data-testid="kv-prefix" value=${text} onInput=${(e) => setText(e.target.value)} /></label>
            <button type="submit">Browse</button></form>
          <${ErrorLine} error=${page.error} />
          <table><thead><tr><th>Key</th><th>Value</th><th class="num">Version</th><th>Expires</th><th>Updated</th><th></th></tr></thead>
          <tbody>${(page.data ? page.data.rows : []).map((r) => html`<tr key=${r.key} data-testid="kv-row">
            <td class="mono">${r.key}</td><td><${Json} value=${r.value} short /></td><td class="num mono">${r.version}</td>
            <td class="muted">${r.expiresAt ? `${fmt.time(r.expiresAt)} (${fmt.rel(r.expiresAt)})` : 'never'}</td>
            <td class="muted">${fmt.rel(r.updatedAt)}</td>
            <td><${Danger} class="small" data-testid="kv-delete" onClick=${() => act({
              confirm: [`Delete ${ns} / ${r.key}?`, `Version ${r.version} is deleted unless the key changed since (expect).`],
              run: () => kv({ op: 'delete', ns, key: r.key, expect: r.version }),
              ok: (x) => (x.applied ? 'Deleted' : `Not deleted: ${x.reason}`), after: page.reload })}>Delete</${Danger}></td></tr>`)}</tbody></table>
          ${page.data && page.data.rows.length === 0 && html`<${Empty}>No live key with this prefix.</${Empty}>`}
          <div class="pager">
            <button disabled=${trail.length === 0} onClick=${() => { const t = [...trail]; const prev = t.pop(); setTrail(t); nav({ after: prev }); }}>‹ Prev</button>
            <button disabled=${!(page.data && page.data.truncated)} onClick=${() => { setTrail([...trail, after]); nav({ after: page.data.nextAfter }); }}>Next ›</button>
          </div></div>`}
        <${KeyTool} ns=${ns} reload=${page.reload} reloadNames=${names.reload} />
      </div>
    </div>`;
}

function KeyTool({ ns, reload, reloadNames }) {
  const a = useAuth();
  const [form, setForm] = useState({ ns, key: '', value: '', ttl: '' });
  const [got, setGot] = useState(null);
  const f = { ...form, ns: form.ns || ns };
  const set = (k) => (e) => setForm({ ...form, [k]: e.target.value });
  const read = async () => {
    try { setGot(await kv({ op: 'get', ns: f.ns, key: f.key })); } catch (e) { setGot({ error: e.message }); }
  };
  const put = () => {
    let value;
    try { value = JSON.parse(f.value); } catch { setGot({ error: 'The value must be JSON (e.g. {"status": "paid"} or "text").' }); return; }
    return act({
      confirm: [`Write ${f.ns} / ${f.key}?`, 'The key is replaced by this value.', false],
      run: () => kv({ op: 'put', ns: f.ns, key: f.key, value, ...(f.ttl ? { ttlSeconds: Number(f.ttl) } : { forever: true }) }),
      ok: (x) => `Written, version ${x.version}`, after: () => { reload(); reloadNames(); read(); },
    });
  };
  return html`<div class="panel" data-testid="kv-tool"><h3>One key</h3>
    <div class="filters">
      <label>Namespace<input data-testid="kv-ns" value=${f.ns} onInput=${set('ns')} /></label>
      <label>Key<input data-testid="kv-key" value=${f.key} onInput=${set('key')} /></label>
      <button data-testid="kv-get" disabled=${!f.ns || !f.key} onClick=${read}>Get</button>
    </div>
    ${got && (got.error ? html`<div class="error">${got.error}</div>` : got.found === false
      ? html`<div class="muted" data-testid="kv-got">Not found.</div>`
      : html`<div data-testid="kv-got"><div class="muted small">version ${got.version} · expires ${got.expiresAt ? fmt.time(got.expiresAt) : 'never'}</div><${Json} value=${got.value} /></div>`)}
    ${!a.readOnly && html`<div class="filters" style="margin-top:10px">
      <label style="flex:1">Value (JSON)<textarea data-testid="kv-value" value=${f.value} onInput=${set('value')}></textarea></label>
      <label>TTL seconds (empty = forever)<input type="number" value=${f.ttl} onInput=${set('ttl')} /></label>
      <${Write} class="primary" data-testid="kv-put" disabled=${!f.ns || !f.key || !f.value} onClick=${put}>Put</${Write}>
    </div>`}
  </div>`;
}
