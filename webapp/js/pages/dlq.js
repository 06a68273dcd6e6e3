// Dead letters: newest first with error, attempts and the decoded payload; requeue one or a selection.
import { useState } from 'preact/hooks';
import { enc, get, post } from '../api.js';
import { act, Empty, ErrorLine, fmt, html, Json, link, Pager, usePoll, useAuth } from '../ui.js';
import { QueuePicker } from './messages.js';

const PAGE = 50;
const key = (m) => `${m.partitionId}/${m.transactionId}`;

export function DeadLetters({ query, nav }) {
  const a = useAuth();
  const offset = Number(query.offset || 0);
  const params = { queue: query.queue, consumerGroup: query.consumerGroup, limit: PAGE, offset };
  const list = usePoll(() => get('dlq', params), [JSON.stringify(params)]);
  const [picked, setPicked] = useState(new Set());
  const d = list.data;
  const rows = d ? d.messages : [];
  const toggle = (k) => { const s = new Set(picked); if (s.has(k)) s.delete(k); else s.add(k); setPicked(s); };
  const requeue = (ms) => act({
    confirm: [`Requeue ${ms.length} message${ms.length > 1 ? 's' : ''}?`, 'Each is put back at the end of its partition and delivered again to its group.', false],
    run: async () => { for (const m of ms) await post(`messages/${enc(m.partitionId)}/${enc(m.transactionId)}/retry`); return ms.length; },
    ok: (n) => `Requeued ${n}`,
    after: () => { setPicked(new Set()); list.reload(); },
  });
  const selected = rows.filter((m) => picked.has(key(m)));
  return html`
    <h2>Dead letters <small>${d ? `${fmt.n(d.total)} in all` : ''}</small></h2>
    <div class="filters">
      <${QueuePicker} none="all queues" value=${query.queue} onPick=${(q) => nav({ queue: q, offset: 0 })} />
      <label>Group<input value=${query.consumerGroup || ''} onChange=${(e) => nav({ consumerGroup: e.target.value, offset: 0 })} /></label>
      <span style="flex:1"></span>
      ${!a.readOnly && html`<button class="primary" data-testid="dlq-requeue-selected" disabled=${selected.length === 0}
        onClick=${() => requeue(selected)}>Requeue selected (${selected.length})</button>`}
    </div>
    <${ErrorLine} error=${list.error} />
    <div class="panel">
      <table><thead><tr>${!a.readOnly && html`<th><input type="checkbox" data-testid="dlq-all" checked=${rows.length > 0 && selected.length === rows.length}
          onChange=${(e) => setPicked(e.target.checked ? new Set(rows.map(key)) : new Set())} /></th>`}
        <th>Queue / partition</th><th>Transaction id</th><th>Group</th><th>Error</th><th class="num">Attempts</th><th>Failed</th><th>Payload</th><th></th></tr></thead>
      <tbody>${rows.map((m) => html`<tr key=${`${key(m)}/${m.dlqId}`} data-testid="dlq-row">
        ${!a.readOnly && html`<td><input type="checkbox" checked=${picked.has(key(m))} onChange=${() => toggle(key(m))} /></td>`}
        <td><a href=${link(`/queues/${enc(m.queue)}`)}>${m.queue}</a> / ${m.partition}</td>
        <td><a class="mono" href=${link(`/messages/${enc(m.partitionId)}/${enc(m.transactionId)}`)}>${m.transactionId}</a></td>
        <td>${m.consumerGroup}</td><td class=${m.errorMessage ? '' : 'muted'}>${m.errorMessage || 'no error given'}</td>
        <td class="num">${fmt.n(m.retryCount)}</td><td class="muted">${fmt.rel(m.failedAt)}</td>
        <td>${m.data === undefined || m.data === null ? html`<span class="muted">(being copied)</span>` : html`<${Json} value=${m.data} short />`}</td>
        <td>${!a.readOnly && html`<button class="small" data-testid="dlq-requeue" onClick=${() => requeue([m])}>Requeue</button>`}</td></tr>`)}</tbody></table>
      ${d && rows.length === 0 && html`<${Empty}>No dead letters. Good.</${Empty}>`}
      ${d && html`<${Pager} offset=${offset} limit=${PAGE} total=${d.total} nextOffset=${d.nextOffset} onPage=${(o) => { setPicked(new Set()); nav({ offset: o }); }} />`}
    </div>`;
}
