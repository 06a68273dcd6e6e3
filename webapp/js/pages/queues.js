// Queues: a searchable, paged list; a queue's page with its configuration (editable), its groups
// (lag in messages and seconds) and its partitions with each group's cursor, lag and lease.
import { useEffect, useState } from 'preact/hooks';
import { del, enc, get, post } from '../api.js';
import { act, Danger, ErrorLine, fmt, html, link, Pager, Stat, usePoll, useAuth } from '../ui.js';

const PAGE = 25;

export function Queues({ query, nav }) {
  const search = query.search || '';
  const offset = Number(query.offset || 0);
  const [text, setText] = useState(search);
  const list = usePoll(() => get('resources/queues', { search, limit: PAGE, offset }), [search, offset]);
  useEffect(() => {
    const t = setTimeout(() => { if (text !== search) nav({ search: text, offset: 0 }); }, 300);
    return () => clearTimeout(t);
  }, [text]);
  const d = list.data;
  return html`
    <h2>Queues <small>${d ? `${fmt.n(d.total)} in all` : ''}</small></h2>
    <div class="filters"><label>Search<input data-testid="queue-search" placeholder="name contains…" value=${text}
      onInput=${(e) => setText(e.target.value)} /></label></div>
    <${ErrorLine} error=${list.error} />
    <div class="panel">
      <table><thead><tr><th>Queue</th><th>Namespace / task</th><th class="num">Partitions</th><th class="num">Messages</th>
        <th class="num">Backlog</th><th class="num">In flight</th><th class="num">DLQ</th><th>Groups (lag)</th></tr></thead>
      <tbody>${(d ? d.queues : []).map((q) => html`<tr key=${q.name} data-testid="queue-row">
        <td><a href=${link(`/queues/${enc(q.name)}`)}>${q.name}</a></td>
        <td class="muted">${q.namespace || ''}${q.task ? ` / ${q.task}` : ''}</td>
        <td class="num">${fmt.n(q.partitions)}</td><td class="num">${fmt.n(q.messages)}</td>
        <td class="num">${fmt.n(q.backlog)}</td><td class="num">${fmt.n(q.inFlight)}</td>
        <td class="num">${q.dlq ? html`<a class="badge bad" href=${link('/dlq', { queue: q.name })}>${fmt.n(q.dlq)}</a>` : '0'}</td>
        <td>${q.groups.map((g) => html`<span key=${g.name} class=${`badge ${g.lag ? 'warn' : 'ok'}`} style="margin-right:4px">${g.queueMode ? '(queue mode)' : g.name} ${fmt.n(g.lag)}</span>`)}</td>
      </tr>`)}</tbody></table>
      ${d && d.queues.length === 0 && html`<div class="empty">No queue${search ? ` matches “${search}”` : ''}.</div>`}
      ${d && html`<${Pager} offset=${offset} limit=${PAGE} total=${d.total} onPage=${(o) => nav({ offset: o })} />`}
    </div>`;
}

const OPTIONS = [
  ['leaseTime', 'Lease time (s)'], ['retryLimit', 'Retry limit'], ['priority', 'Priority'],
  ['delayedProcessing', 'Delayed processing (s)'], ['windowBuffer', 'Window buffer (s)'], ['maxSize', 'Max size (0 = none)'],
  ['retentionSeconds', 'Retention (s)'], ['completedRetentionSeconds', 'Completed retention (s)'],
  ['dedupWindowSeconds', 'Dedup window (s)'],
];

function Config({ queue, config, reload }) {
  const a = useAuth();
  const [form, setForm] = useState(null);
  const editing = form !== null;
  const start = () => setForm(Object.fromEntries(OPTIONS.map(([k]) => [k, String(config[k] ?? '')])));
  const save = () => act({
    confirm: [`Change the configuration of ${queue}?`, 'New options apply to the next pops and pushes.', false],
    run: () => post('configure', { queue, options: Object.fromEntries(OPTIONS.map(([k]) => [k, Number(form[k])])) }),
    ok: 'Configuration saved',
    after: () => { setForm(null); reload(); },
  });
  return html`<div class="panel" data-testid="queue-config"><h3>Configuration<span class="spacer"></span>
      ${!a.readOnly && !editing && html`<button class="small" data-testid="config-edit" onClick=${start}>Edit</button>`}
      ${editing && html`<button class="small" onClick=${() => setForm(null)}>Cancel</button>
        <button class="small primary" data-testid="config-save" onClick=${save}>Save</button>`}</h3>
    <div class="form-grid">${OPTIONS.map(([k, label]) => html`<label key=${k}>${label}
      ${editing ? html`<input type="number" data-testid=${`opt-${k}`} value=${form[k]} onInput=${(e) => setForm({ ...form, [k]: e.target.value })} />`
                : html`<b class="mono" data-testid=${`val-${k}`}>${fmt.n(config[k])}</b>`}</label>`)}
      <label>Encryption<b>${config.encryptionEnabled ? 'on' : 'off'}</b></label>
    </div></div>`;
}

export function QueuePage({ queue, query, nav }) {
  const offset = Number(query.offset || 0);
  const q = usePoll(() => get(`resources/queues/${enc(queue)}`, { limit: PAGE, offset }), [queue, offset]);
  const d = q.data;
  return html`
    <h2><a href="#/queues">Queues</a> / ${queue}
      <small>${d && d.namespace ? `namespace ${d.namespace}` : ''}${d && d.task ? ` · task ${d.task}` : ''}</small></h2>
    <${ErrorLine} error=${q.error} />
    ${d && html`
    <div class="stats" style="grid-template-columns: repeat(6, 1fr)">
      <${Stat} label="Partitions" value=${fmt.n(d.partitionsTotal)} />
      <${Stat} label="Messages" value=${fmt.n(d.messages)} /><${Stat} label="Retained" value=${fmt.n(d.retained)} />
      <${Stat} label="Backlog" value=${fmt.n(d.backlog)} /><${Stat} label="In flight" value=${fmt.n(d.inFlight)} />
      <${Stat} label="Dead letters" value=${fmt.n(d.dlq)} warn=${d.dlq > 0} />
    </div>
    <div class="filters">
      <a href=${link('/messages', { queue })}>Browse messages</a> · <a href=${link('/dlq', { queue })}>Dead letters</a> ·
      <a href=${link('/timers', { queue })}>Timers</a> <span style="flex:1"></span>
      <${Danger} data-testid="queue-delete" onClick=${() => act({
        confirm: [`Delete queue ${queue}?`, 'Its partitions, messages, cursors and dead letters are deleted. This cannot be undone.'],
        run: () => del(`resources/queues/${enc(queue)}`), ok: `Queue ${queue} deleted`, after: () => { location.hash = '#/queues'; } })}>Delete queue</${Danger}>
    </div>
    <${Config} queue=${queue} config=${d.config} reload=${q.reload} />
    <div class="panel"><h3>Consumer groups</h3>
      ${d.groups.length === 0 ? html`<div class="empty">No consumer group has read this queue.</div>` : html`
      <table><thead><tr><th>Group</th><th>Mode</th><th class="num">Lag</th><th class="num">Lag (time)</th><th class="num">Leased partitions</th><th>Subscription</th><th>Created</th></tr></thead>
      <tbody>${d.groups.map((g) => html`<tr key=${g.name || '__q'} data-testid="group-row">
        <td><a href=${link(`/groups/${enc(g.queueMode ? '__QUEUE_MODE__' : g.name)}`)}>${g.queueMode ? '(queue mode)' : g.name}</a></td>
        <td>${g.queueMode ? 'queue' : 'group'}</td>
        <td class="num" data-testid="group-lag">${fmt.n(g.lag)}</td><td class="num">${fmt.secs(g.lagSeconds)}</td>
        <td class="num">${fmt.n(g.leasedPartitions)}</td><td class="muted">${g.subscriptionMode || ''} ${g.subscriptionFrom ? fmt.time(g.subscriptionFrom) : ''}</td>
        <td class="muted">${fmt.time(g.createdAt)}</td></tr>`)}</tbody></table>`}
    </div>
    <div class="panel"><h3>Partitions</h3>
      <table><thead><tr><th>Partition</th><th class="num">Offsets</th><th class="num">Retained</th><th>Last write</th><th>Group: cursor · lag · lease</th></tr></thead>
      <tbody>${d.partitions.map((p) => html`<tr key=${p.id}>
        <td><a href=${link('/messages', { queue, partition: p.name })}>${p.name}</a></td>
        <td class="num mono">${p.firstOffset}–${p.nextOffset}</td><td class="num">${fmt.n(p.retained)}</td>
        <td class="muted">${fmt.rel(p.lastWriteAt)}</td>
        <td>${p.groups.map((g) => html`<div key=${g.name || '__q'}><b>${g.queueMode ? '(queue mode)' : g.name}</b>:
          cursor <span class="mono">${g.cursor}</span> · lag <span class=${g.lag ? 'badge warn' : 'badge ok'}>${fmt.n(g.lag)}</span>
          ${g.leased ? html` · <span class="badge">leased, expires ${fmt.rel(g.leaseExpiresAt)}</span>` : ''}</div>`)}</td></tr>`)}
      </tbody></table>
      <${Pager} offset=${offset} limit=${PAGE} total=${d.partitionsTotal} onPage=${(o) => nav({ offset: o })} />
    </div>`}`;
}
