// Overview: the counts, throughput and backlog over the last hour, the groups that lag most, the
// maintenance switches and the broker process answering (pool, parked pops, limiters).
import { get, post } from '../api.js';
import { columns, TimeChart } from '../chart.js';
import { act, ErrorLine, fmt, html, link, Stat, usePoll, useAuth } from '../ui.js';

export function Overview() {
  const status = usePoll(() => get('status'), []);
  const series = usePoll(() => get('status/analytics'), [], 15000);
  const lagging = usePoll(() => get('consumer-groups/lagging', { minLagSeconds: 0, limit: 8 }), []);
  const proc = usePoll(() => get('analytics/worker-metrics'), []);
  const s = status.data;
  const rows = series.data ? series.data.series : [];
  return html`
    <h2>Overview <small>${s ? `version ${s.version} · database ${s.database}` : ''}</small></h2>
    <${ErrorLine} error=${status.error} />
    <div class="stats">
      <${Stat} testid="stat-queues" label="Queues" value=${fmt.n(s && s.queues)} />
      <${Stat} testid="stat-partitions" label="Partitions" value=${fmt.n(s && s.partitions)} />
      <${Stat} testid="stat-messages" label="Messages" value=${fmt.n(s && s.messages)} />
      <${Stat} testid="stat-backlog" label="Backlog" value=${fmt.n(s && s.backlog)} />
      <${Stat} testid="stat-inflight" label="In flight" value=${fmt.n(s && s.inFlight)} />
      <${Stat} testid="stat-dlq" label="Dead letters" value=${fmt.n(s && s.dlq)} warn=${s && s.dlq > 0} />
      <${Stat} testid="stat-groups" label="Consumer groups" value=${fmt.n(s && s.consumerGroups)} />
    </div>
    <div class="row">
      <div class="panel"><h3>Throughput per minute <span class="spacer"></span>
        <span class="muted small">last hour: ${fmt.n(s && s.throughput.lastHour.pushed)} pushed, ${fmt.n(s && s.throughput.lastHour.acked)} acked</span></h3>
        <${TimeChart} testid="chart-throughput" series=${['pushed', 'acked']} data=${columns(rows, ['pushed', 'acked'])} />
      </div>
      <div class="panel"><h3>Backlog and lag</h3>
        <${TimeChart} testid="chart-backlog" series=${['backlog', 'lag seconds']} right="lag seconds" data=${columns(rows, ['backlog', 'lagSeconds'])} />
      </div>
    </div>
    <div class="row">
      <div class="panel"><h3>Groups lagging most <span class="spacer"></span><a class="small" href="#/groups">all groups</a></h3>
        <${ErrorLine} error=${lagging.error} />
        ${lagging.data && lagging.data.groups.length === 0 ? html`<div class="empty">No group has pending messages.</div>` : html`
        <table><thead><tr><th>Group</th><th>Queue</th><th class="num">Lag</th><th class="num">Oldest pending</th><th class="num">Partitions behind</th></tr></thead>
        <tbody>${(lagging.data ? [...lagging.data.groups].sort((a, b) => b.lagSeconds - a.lagSeconds) : []).map((g) => html`
          <tr key=${`${g.queue}/${g.name}`}><td><a href=${link(`/groups/${encodeURIComponent(g.queueMode ? '__QUEUE_MODE__' : g.name)}`)}>${g.queueMode ? '(queue mode)' : g.name}</a></td>
          <td><a href=${link(`/queues/${encodeURIComponent(g.queue)}`)}>${g.queue}</a></td>
          <td class="num">${fmt.n(g.lag)}</td><td class="num">${fmt.secs(g.lagSeconds)}</td><td class="num">${g.partitionsBehind}/${g.partitions}</td></tr>`)}
        </tbody></table>`}
      </div>
      <div class="panel side" style="flex: 0 0 380px"><${Maintenance} status=${s} reload=${status.reload} /></div>
    </div>
    <div class="panel"><h3>Broker process answering</h3>
      <${ErrorLine} error=${proc.error} />
      <${Workers} data=${proc.data} />
    </div>`;
}

function Maintenance({ status, reload }) {
  const a = useAuth();
  const m = status ? status.maintenance : null;
  const sw = (which, label, path, help) => {
    const on = m && m[which];
    return html`<div class="switch" data-testid=${`maint-${which}`}>
      <div><b style="white-space:nowrap">${label}</b> <span class=${`badge ${on ? 'bad' : 'ok'}`} data-testid=${`maint-${which}-state`}>${on ? 'on' : 'off'}</span><div class="muted small">${help}</div></div>
      ${!a.readOnly && html`<button class=${on ? '' : 'danger'} disabled=${!m} data-testid=${`maint-${which}-toggle`} onClick=${() => act({
        confirm: [`${on ? 'End' : 'Start'} ${label.toLowerCase()}?`, on ? 'Clients go back to normal.' : help],
        run: () => post(path, { enabled: !on }), ok: `${label} ${on ? 'off' : 'on'}`, after: reload })}>${on ? 'Turn off' : 'Turn on'}</button>`}
    </div>`;
  };
  return html`<h3>Maintenance</h3>
    ${sw('push', 'Push maintenance', 'system/maintenance', 'Pushes answer 503 until it is turned off.')}
    ${sw('pop', 'Pop maintenance', 'system/maintenance/pop', 'Pops answer 204 (nothing) until it is turned off.')}`;
}

function Workers({ data }) {
  if (!data) return null;
  return html`<table><thead><tr><th>pid</th><th class="num">uptime</th><th class="num">CPU</th><th class="num">peak RSS</th>
    <th class="num">pool in use / size / max</th><th class="num">parked pops</th><th>limiters (in flight / limit, queued)</th><th>jobs</th></tr></thead>
    <tbody>${data.workers.map((w) => html`<tr key=${w.pid}>
      <td class="mono">${w.pid}</td><td class="num">${fmt.secs(w.uptimeSeconds)}</td><td class="num">${fmt.secs(w.cpuSeconds)}</td>
      <td class="num">${fmt.bytes(w.maxRssBytes)}</td>
      <td class="num">${w.pool.inUse} / ${w.pool.size} / ${w.pool.max}</td>
      <td class="num">${fmt.n(w.longPoll.parked)} / ${fmt.n(w.longPoll.limit)}</td>
      <td>${Object.entries(w.limiters || {}).map(([k, l]) => html`<span class="badge" key=${k} style="margin-right:4px">${k} ${l.inFlight}/${l.limit}${l.queued ? `, ${l.queued} queued` : ''}</span>`)}
          ${!w.limiters || Object.keys(w.limiters).length === 0 ? html`<span class="muted">off</span>` : ''}</td>
      <td class="muted small">${w.jobs.length ? w.jobs.join(', ') : 'none (jobs off)'}</td></tr>`)}</tbody></table>
    ${data.workers.map((w) => html`<${MeshPeers} key=${`mesh-${w.pid}`} mesh=${w.mesh} />`)}
    <div class="muted small">${data.note}</div>`;
}

// The replicas and workers the answering process reaches over the wake mesh (README "Running several
// replicas"); the API knows no other process, so this is what "replicas seen" can honestly show.
function MeshPeers({ mesh }) {
  if (!mesh) return html`<div class="muted small" data-testid="mesh-off">Wake mesh off: this process sees no other replica.</div>`;
  return html`<h4>Replicas and workers seen over the mesh (node ${mesh.node})</h4>
    <table data-testid="mesh-peers"><thead><tr><th>peer</th><th>kind</th><th>state</th><th class="num">outbox</th></tr></thead>
    <tbody>${mesh.peers.map((p) => html`<tr key=${p.name}><td class="mono">${p.name}</td><td>${p.worker ? 'worker' : 'replica'}</td>
      <td><span class=${`badge ${p.connected ? 'ok' : 'bad'}`}>${p.connected ? 'connected' : 'down'}</span></td>
      <td class="num">${fmt.n(p.outbox)}</td></tr>`)}
      ${mesh.peers.length === 0 ? html`<tr><td colspan="4" class="muted">no peers configured</td></tr>` : ''}</tbody></table>
    <div class="muted small">frames sent ${fmt.n(mesh.framesSent)}, received ${fmt.n(mesh.framesReceived)}, dropped ${fmt.n(mesh.dropped)}</div>`;
}
