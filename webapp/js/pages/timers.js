// Timers: a queue's pending timers (key, due time, payload), cancel one.
import { useRef } from 'preact/hooks';
import { del, enc, get } from '../api.js';
import { act, Danger, Empty, ErrorLine, fmt, html, Json, usePoll } from '../ui.js';
import { QueuePicker } from './messages.js';

const PAGE = 25;
const keyPath = (k) => k.split('/').map(enc).join('/'); // the timer key keeps its slashes (docs/wire.md#timers)

export function Timers({ query, nav }) {
  const queue = query.queue || '';
  const after = query.after || '';
  const payloads = useRef(new Map()); // txn -> payload: a timer's txn changes when it is rescheduled
  const page = usePoll(async () => {
    if (!queue) return null;
    const p = await get(`timers/${enc(queue)}`, { limit: PAGE, after });
    await Promise.all(p.rows.filter((r) => !payloads.current.has(r.txn)).map(async (r) => {
      const one = await get(`timers/${enc(queue)}/${keyPath(r.timerKey)}`);
      if (one.found) payloads.current.set(r.txn, one.data);
    }));
    return p;
  }, [queue, after]);
  const d = page.data;
  return html`
    <h2>Timers <small>${queue ? `pending on ${queue}` : ''}</small></h2>
    <div class="filters"><${QueuePicker} free value=${queue} testid="timer-queue" onPick=${(q) => nav({ queue: q, after: '' })} />
      <span class="muted small">A timer's queue need not exist yet: it is created when the timer fires.</span></div>
    <${ErrorLine} error=${page.error} />
    ${!queue ? html`<${Empty}>Name a queue to see its pending timers.</${Empty}>` : html`<div class="panel">
      <table><thead><tr><th>Timer key</th><th>Due</th><th>Partition</th><th>Payload</th><th>txn</th><th></th></tr></thead>
      <tbody>${(d ? d.rows : []).map((t) => html`<tr key=${t.timerKey} data-testid="timer-row">
        <td class="mono">${t.timerKey}</td><td>${fmt.time(t.deliverAt)} <span class="muted">(${fmt.rel(t.deliverAt)})</span></td>
        <td>${t.partition}</td><td><${Json} value=${payloads.current.get(t.txn)} short /></td><td class="mono muted small">${t.txn}</td>
        <td><${Danger} class="small" data-testid="timer-cancel" onClick=${() => act({
          confirm: [`Cancel timer ${t.timerKey}?`, 'It will not fire. (A timer that fires meanwhile is not cancelled.)'],
          run: () => del(`timers/${enc(queue)}/${keyPath(t.timerKey)}`, { txn: t.txn }),
          ok: (r) => `Timer ${r.status || r.result || 'cancelled'}`, after: page.reload })}>Cancel</${Danger}></td></tr>`)}</tbody></table>
      ${d && d.rows.length === 0 && html`<${Empty}>No pending timer on ${queue}.</${Empty}>`}
      <div class="pager"><button disabled=${!after} onClick=${() => nav({ after: '' })}>« First</button>
        <button disabled=${!(d && d.truncated)} onClick=${() => nav({ after: d.nextAfter })}>Next ›</button></div>
    </div>`}`;
}
