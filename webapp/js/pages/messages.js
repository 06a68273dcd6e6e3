// Messages: browse a queue (partition, offsets, time, a group's status), and one message: its payload,
// its state in every group, its dead letters, its traces timeline; delete.
import { useState } from 'preact/hooks';
import { del, enc, get, post } from '../api.js';
import { act, Danger, Empty, ErrorLine, fmt, html, Json, link, Pager, usePoll } from '../ui.js';

const PAGE = 50;
const FIELDS = [['partition', 'Partition'], ['fromOffset', 'From offset'], ['toOffset', 'To offset (excl.)'],
  ['from', 'Written from (ISO)'], ['to', 'Written before (ISO)'], ['consumerGroup', 'Group status for']];

export function QueuePicker({ value, onPick, testid = 'queue-pick', free = false, none = '— choose —' }) {
  const qs = usePoll(() => get('resources/queues', { limit: 200 }), [], 30000);
  const names = qs.data ? qs.data.queues.map((q) => q.name) : [];
  const [text, setText] = useState(value || '');
  if (free) {
    return html`<label>Queue<input list="queue-names" data-testid=${testid} value=${text} placeholder="queue name"
        onInput=${(e) => setText(e.target.value)} onKeyDown=${(e) => e.key === 'Enter' && onPick(text.trim())}
        onChange=${(e) => onPick(e.target.value.trim())} />
      <datalist id="queue-names">${names.map((n) => html`<option key=${n} value=${n} />`)}</datalist></label>`;
  }
  return html`<label>Queue<select data-testid=${testid} value=${value || ''} onChange=${(e) => onPick(e.target.value)}>
    <option value="">${none}</option>${[...new Set([...(value ? [value] : []), ...names])].map((n) => html`<option key=${n} value=${n}>${n}</option>`)}</select></label>`;
}

export function Messages({ query, nav }) {
  const queue = query.queue || '';
  const offset = Number(query.offset || 0);
  const [form, setForm] = useState(() => Object.fromEntries(FIELDS.map(([k]) => [k, query[k] || ''])));
  const status = (query.consumerGroup && query.status) || '';  // the API filters (and pages) by a group's status
  const params = { queue, order: query.order || 'desc', limit: PAGE, offset, status, ...Object.fromEntries(FIELDS.map(([k]) => [k, query[k]])) };
  const list = usePoll(() => (queue ? get('messages', params) : Promise.resolve(null)), [JSON.stringify(params)]);
  const d = list.data;
  const rows = d ? d.messages : [];
  const apply = (e) => { e.preventDefault(); nav({ ...form, offset: 0, ...(form.consumerGroup ? {} : { status: '' }) }); };
  return html`
    <h2>Messages <small data-testid="messages-total">${d ? `${fmt.n(d.total)}${status ? ` ${status}` : ''} in ${queue}${d.partition ? ` / ${d.partition}` : ''}` : ''}</small></h2>
    <form class="filters" onSubmit=${apply}>
      <${QueuePicker} value=${queue} onPick=${(q) => nav({ queue: q, offset: 0, partition: '' })} />
      ${FIELDS.map(([k, label]) => html`<label key=${k}>${label}<input data-testid=${`f-${k}`} value=${form[k]}
        onInput=${(e) => setForm({ ...form, [k]: e.target.value })} /></label>`)}
      <label>Status<select data-testid="f-status" value=${status} disabled=${!query.consumerGroup} onChange=${(e) => nav({ status: e.target.value, offset: 0 })}>
        ${['', 'pending', 'leased', 'consumed', 'dead'].map((s) => html`<option key=${s} value=${s}>${s || 'any'}</option>`)}</select></label>
      <label>Order<select value=${query.order || 'desc'} onChange=${(e) => nav({ order: e.target.value, offset: 0 })}>
        <option value="desc">newest first</option><option value="asc">oldest first</option></select></label>
      <button class="primary" type="submit">Apply</button>
    </form>
    <${ErrorLine} error=${list.error} />
    ${!queue ? html`<${Empty}>Choose a queue to browse its messages.</${Empty}>` : html`
    <div class="panel">
      <table><thead><tr><th>Partition</th><th class="num">Offset</th><th>Transaction id</th><th>Written</th>
        ${query.consumerGroup && html`<th>Status (${query.consumerGroup})</th>`}<th>Payload</th></tr></thead>
      <tbody>${rows.map((m) => html`<tr key=${m.id} data-testid="message-row">
        <td>${m.partition}</td><td class="num mono">${m.offset}</td>
        <td><a class="mono" href=${link(`/messages/${enc(m.partitionId)}/${enc(m.transactionId)}`)}>${m.transactionId}</a></td>
        <td class="muted">${fmt.time(m.createdAt)}</td>
        ${query.consumerGroup && html`<td><span class=${`badge state-${m.status}`}>${m.status}</span></td>`}
        <td><${Json} value=${m.data} short /></td></tr>`)}</tbody></table>
      ${d && rows.length === 0 && html`<${Empty}>No message${status ? ` ${status} for ${query.consumerGroup}` : ' on this page'}.</${Empty}>`}
      ${d && html`<${Pager} offset=${offset} limit=${PAGE} total=${d.total} nextOffset=${d.nextOffset} onPage=${(o) => nav({ offset: o })} />`}
    </div>`}`;
}

export function MessagePage({ pid, txn }) {
  const path = `${enc(pid)}/${enc(txn)}`;
  const m = usePoll(() => get(`messages/${path}`), [path]);
  const traces = usePoll(() => get(`traces/${path}`, { limit: 200 }), [path]);
  const d = m.data;
  return html`
    <h2><a href=${link('/messages', d ? { queue: d.queue } : {})}>Messages</a> / <span class="mono">${txn}</span></h2>
    <${ErrorLine} error=${m.error} />
    ${d && html`<div class="row">
      <div class="panel"><h3>Message<span class="spacer"></span>
        <${Danger} class="small" data-testid="message-delete" onClick=${() => act({
          confirm: ['Delete this message?', 'It is marked done for every consumer group, its dead letters are removed and its transactionId is forgotten.'],
          run: () => del(`messages/${path}`), ok: 'Message deleted', after: () => { location.hash = link('/messages', { queue: d.queue }); } })}>Delete</${Danger}></h3>
        <dl class="kv-pairs"><dt>Queue</dt><dd><a href=${link(`/queues/${enc(d.queue)}`)}>${d.queue}</a></dd>
          <dt>Partition</dt><dd>${d.partition} <span class="muted">(id ${d.partitionId})</span></dd>
          <dt>Offset</dt><dd class="mono">${d.offset}</dd><dt>Message id</dt><dd class="mono">${d.id}</dd>
          <dt>Trace id</dt><dd class="mono">${d.traceId || '–'}</dd><dt>Written</dt><dd>${fmt.time(d.createdAt)}</dd></dl>
        <h3 style="margin-top:10px">Payload</h3><${Json} value=${d.data} />
      </div>
      <div class="panel"><h3>State in each group</h3>
        ${d.groups.length === 0 ? html`<${Empty}>No consumer group on this queue yet.</${Empty}>` : html`
        <table><thead><tr><th>Group</th><th>State</th><th class="num">Cursor</th></tr></thead>
        <tbody>${d.groups.map((g) => html`<tr key=${g.name || '__q'} data-testid="message-group">
          <td>${g.queueMode ? '(queue mode)' : g.name}</td><td><span class=${`badge state-${g.state}`}>${g.state}</span></td><td class="num mono">${g.cursor}</td></tr>`)}</tbody></table>`}
        ${d.deadLetters.length > 0 && html`<h3 style="margin-top:10px">Dead letters</h3>
          <table><thead><tr><th>Group</th><th>Error</th><th class="num">Attempts</th><th>Failed</th><th></th></tr></thead>
          <tbody>${d.deadLetters.map((x, i) => html`<tr key=${i}><td>${x.consumerGroup}</td><td>${x.errorMessage || '–'}</td>
            <td class="num">${x.retryCount}</td><td>${fmt.time(x.failedAt)}</td>
            <td><${Danger} class="small" onClick=${() => act({ confirm: ['Requeue this message?', 'It is put back at the end of its partition.', false],
              run: () => post(`messages/${path}/retry`), ok: 'Requeued', after: m.reload })}>Requeue</${Danger}></td></tr>`)}</tbody></table>`}
        <h3 style="margin-top:10px">Traces</h3>
        <${Timeline} data=${traces.data} error=${traces.error} />
      </div></div>`}`;
}

export function Timeline({ data, error }) {
  if (error) return html`<${ErrorLine} error=${error} />`;
  if (!data) return null;
  const rows = [...data.traces].sort((a, b) => (a.createdAt < b.createdAt ? -1 : 1));
  if (rows.length === 0) return html`<${Empty}>No trace events.</${Empty}>`;
  return html`<ul class="timeline" data-testid="timeline">${rows.map((t) => html`<li key=${t.id}>
    <b>${t.eventType}</b> <span class="muted">${fmt.time(t.createdAt)} · ${t.queueMode ? 'queue mode' : t.consumerGroup}</span>
    ${t.traceNames && t.traceNames.length ? html` ${t.traceNames.map((n) => html`<a key=${n} class="badge" href=${link('/traces', { name: n })}>${n}</a> `)}` : ''}
    ${t.transactionId && html`<div class="muted small">${t.queue} / ${t.partition} / <a class="mono" href=${link(`/messages/${enc(t.partitionId)}/${enc(t.transactionId)}`)}>${t.transactionId}</a></div>`}
    <${Json} value=${t.data} short /></li>`)}</ul>`;
}
