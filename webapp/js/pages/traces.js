// Traces: the names in use, a name's events (newest first), or one message's timeline.
import { useState } from 'preact/hooks';
import { enc, get } from '../api.js';
import { Empty, ErrorLine, html, link, Pager, usePoll } from '../ui.js';
import { Timeline } from './messages.js';

const PAGE = 50;

export function Traces({ query, nav }) {
  const name = query.name || '';
  const offset = Number(query.offset || 0);
  const [search, setSearch] = useState('');
  const [msg, setMsg] = useState({ pid: query.pid || '', txn: query.txn || '' });
  const names = usePoll(() => get('traces/names', { search, limit: 100 }), [search]);
  const events = usePoll(() => {
    if (name) return get(`traces/by-name/${enc(name)}`, { limit: PAGE, offset });
    if (query.pid && query.txn) return get(`traces/${enc(query.pid)}/${enc(query.txn)}`, { limit: PAGE, offset });
    return Promise.resolve(null);
  }, [name, query.pid, query.txn, offset]);
  const d = events.data;
  return html`
    <h2>Traces <small>${name ? `name ${name}` : query.txn ? `message ${query.txn}` : ''}</small></h2>
    <div class="row">
      <div class="panel side"><h3>Names</h3>
        <input placeholder="search" value=${search} onInput=${(e) => setSearch(e.target.value)} style="width:100%;margin-bottom:6px" />
        <${ErrorLine} error=${names.error} />
        <ul data-testid="trace-names">${(names.data ? names.data.names : []).map((n) => html`<li key=${n.name}>
          <a class=${n.name === name ? 'on' : ''} href=${link('/traces', { name: n.name })}>${n.name} <span class="muted">${n.count}</span></a></li>`)}</ul>
        ${names.data && names.data.names.length === 0 && html`<${Empty}>No trace recorded.</${Empty}>`}
      </div>
      <div>
        <form class="filters panel" onSubmit=${(e) => { e.preventDefault(); nav({ name: '', offset: 0, pid: msg.pid, txn: msg.txn }); }}>
          <b>By message</b>
          <label>Partition id<input value=${msg.pid} onInput=${(e) => setMsg({ ...msg, pid: e.target.value })} /></label>
          <label>Transaction id<input value=${msg.txn} onInput=${(e) => setMsg({ ...msg, txn: e.target.value })} /></label>
          <button type="submit" disabled=${!msg.pid || !msg.txn}>Show</button>
        </form>
        <div class="panel">
          <${ErrorLine} error=${events.error} />
          ${!d ? html`<${Empty}>Pick a name, or name a message.</${Empty}>` : html`
            <${Timeline} data=${d} />
            ${query.txn && !name && html`<div class="small"><a href=${link(`/messages/${enc(query.pid)}/${enc(query.txn)}`)}>open the message</a></div>`}
            <${Pager} offset=${offset} limit=${PAGE} total=${d.total} nextOffset=${d.nextOffset} onPage=${(o) => nav({ offset: o })} />`}
        </div>
      </div>
    </div>`;
}
