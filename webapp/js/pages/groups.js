// Consumer groups: lagging groups first; a group's page per queue: cursors, lag and leases per
// partition; seek to the start, the end or a time (with confirmation); delete.
import { useState } from 'preact/hooks';
import { del, enc, post, get } from '../api.js';
import { act, Danger, Empty, ErrorLine, fmt, html, link, Pager, usePoll, useAuth } from '../ui.js';

const PAGE = 50;
const QM = '__QUEUE_MODE__';
const label = (name, qm) => (qm || name === QM ? '(queue mode)' : name);

export function Groups({ query, nav }) {
  const offset = Number(query.offset || 0);
  const lagging = usePoll(() => get('consumer-groups/lagging', { minLagSeconds: 0, limit: 100 }), []);
  const all = usePoll(() => get('consumer-groups', { limit: PAGE, offset }), [offset]);
  const lag = lagging.data ? [...lagging.data.groups].sort((a, b) => b.lagSeconds - a.lagSeconds) : [];
  const d = all.data;
  return html`
    <h2>Consumer groups <small>${d ? `${fmt.n(d.total)} (group, queue) pairs` : ''}</small></h2>
    <div class="panel"><h3>Lagging (oldest pending message first)</h3>
      <${ErrorLine} error=${lagging.error} />
      ${lagging.data && lag.length === 0 ? html`<${Empty}>No group has a pending message.</${Empty}>` : html`
      <table><thead><tr><th>Group</th><th>Queue</th><th class="num">Lag (messages)</th><th class="num">Oldest pending</th><th class="num">Partitions behind</th></tr></thead>
      <tbody>${lag.map((g) => html`<tr key=${`${g.queue}/${g.name}`} data-testid="lagging-row">
        <td><a href=${link(`/groups/${enc(g.queueMode ? QM : g.name)}`)}>${label(g.name, g.queueMode)}</a></td>
        <td><a href=${link(`/queues/${enc(g.queue)}`)}>${g.queue}</a></td><td class="num">${fmt.n(g.lag)}</td>
        <td class="num"><span class=${`badge ${g.lagSeconds > 60 ? 'bad' : 'warn'}`}>${fmt.secs(g.lagSeconds)}</span></td>
        <td class="num">${g.partitionsBehind}/${g.partitions}</td></tr>`)}</tbody></table>`}
    </div>
    <div class="panel"><h3>All groups</h3>
      <${ErrorLine} error=${all.error} />
      <table><thead><tr><th>Group</th><th>Queue</th><th class="num">Lag</th><th class="num">Partitions (leased)</th><th>Subscription</th><th>Created</th></tr></thead>
      <tbody>${(d ? d.consumerGroups : []).map((g) => html`<tr key=${`${g.queue}/${g.name}`}>
        <td><a href=${link(`/groups/${enc(g.queueMode ? QM : g.name)}`)}>${label(g.name, g.queueMode)}</a></td>
        <td><a href=${link(`/queues/${enc(g.queue)}`)}>${g.queue}</a></td><td class="num">${fmt.n(g.totalLag)}</td>
        <td class="num">${g.partitions} (${g.leasedPartitions})</td><td class="muted">${g.subscriptionMode || ''}</td>
        <td class="muted">${fmt.time(g.createdAt)}</td></tr>`)}</tbody></table>
      ${d && html`<${Pager} offset=${offset} limit=${PAGE} total=${d.total} onPage=${(o) => nav({ offset: o })} />`}
    </div>`;
}

function Seek({ group, queue, reload }) {
  const a = useAuth();
  const [when, setWhen] = useState('');
  if (a.readOnly) return null;
  const seek = (body, what) => act({
    confirm: [`Move ${label(group)} on ${queue} to ${what}?`, 'Every partition cursor of this group on this queue moves; messages before it are skipped, after it are delivered (again).'],
    run: () => post(`consumer-groups/${enc(group)}/queues/${enc(queue)}/seek`, body), ok: `Moved to ${what}`, after: reload,
  });
  return html`<div class="filters" data-testid=${`seek-${queue}`}>
    <button data-testid="seek-start" onClick=${() => seek({ toStart: true }, 'the start')}>Seek to start</button>
    <button data-testid="seek-end" onClick=${() => seek({ toEnd: true }, 'the end')}>Seek to end</button>
    <label>Time (local)<input type="datetime-local" step="1" data-testid="seek-time-input" value=${when} onInput=${(e) => setWhen(e.target.value)} /></label>
    <button data-testid="seek-time" disabled=${!when} onClick=${() => seek({ timestamp: new Date(when).toISOString() }, new Date(when).toISOString())}>Seek to time</button>
    <span style="flex:1"></span>
    <${Danger} data-testid="group-delete-queue" onClick=${() => act({
      confirm: [`Delete ${label(group)} on ${queue}?`, 'Its cursors and leases on this queue are deleted; it would start again from its subscription.'],
      run: () => del(`consumer-groups/${enc(group)}/queues/${enc(queue)}`), ok: 'Deleted', after: reload })}>Delete on this queue</${Danger}>
  </div>`;
}

export function GroupPage({ group }) {
  const g = usePoll(() => get(`consumer-groups/${enc(group)}`), [group]);
  const d = g.data;
  return html`
    <h2><a href="#/groups">Consumer groups</a> / ${label(group)} <small>${d ? `total lag ${fmt.n(d.totalLag)}` : ''}</small>
      <${Danger} class="small" style="margin-left:12px" data-testid="group-delete" onClick=${() => act({
        confirm: [`Delete ${label(group)} on every queue?`, 'All its cursors and leases are deleted.'],
        run: () => del(`consumer-groups/${enc(group)}`), ok: 'Group deleted', after: () => { location.hash = '#/groups'; } })}>Delete group</${Danger}></h2>
    <${ErrorLine} error=${g.error} />
    ${d && d.queues.length === 0 && html`<${Empty}>This group reads no queue.</${Empty}>`}
    ${d && d.queues.map((q) => html`<div class="panel" key=${q.queue} data-testid="group-queue">
      <h3><a href=${link(`/queues/${enc(q.queue)}`)}>${q.queue}</a>
        <span class="badge warn" data-testid="group-queue-lag">lag ${fmt.n(q.totalLag)}</span>
        <span class="muted small">${q.partitionCount} partitions, ${q.leasedPartitions} leased · ${q.subscriptionMode || ''}</span></h3>
      <${Seek} group=${group} queue=${q.queue} reload=${g.reload} />
      <table><thead><tr><th>Partition</th><th class="num">Cursor</th><th class="num">Next offset</th><th class="num">Lag</th><th>Lease</th><th class="num">Attempts</th><th>Last write</th></tr></thead>
      <tbody>${q.partitions.map((p) => html`<tr key=${p.partitionId}>
        <td><a href=${link('/messages', { queue: q.queue, partition: p.partition, consumerGroup: group })}>${p.partition}</a></td>
        <td class="num mono">${p.cursor}</td><td class="num mono">${p.nextOffset}</td>
        <td class="num"><span class=${`badge ${p.lag ? 'warn' : 'ok'}`}>${fmt.n(p.lag)}</span></td>
        <td>${p.leaseLive ? html`<span class="badge">to offset ${p.leaseEnd}, expires ${fmt.rel(p.leaseExpiresAt)}</span>` : html`<span class="muted">none</span>`}</td>
        <td class="num">${fmt.n(p.deliveryAttempts)}</td><td class="muted">${fmt.rel(p.lastWriteAt)}</td></tr>`)}</tbody></table>
    </div>`)}`;
}
