// Shared pieces of the pages: polling without flicker, tables, pager, confirmation, formatting.
import { h } from 'preact';
import { useCallback, useEffect, useRef, useState } from 'preact/hooks';
import htm from 'htm';
import { auth, onAuth } from './api.js';

export const html = htm.bind(h);
export const REFRESH_MS = 5000;

// Run `load` now and every `every` ms (0 = once) while the tab is visible. The last good data stays on
// screen while a refresh is in flight, so a refresh never blanks the page; an error is shown beside it.
export function usePoll(load, deps, every = REFRESH_MS) {
  const [state, setState] = useState({ data: null, error: null, loading: true });
  const gen = useRef(0);
  const run = useCallback(async () => {
    const mine = ++gen.current;
    try {
      const data = await load();
      if (mine === gen.current) setState({ data, error: null, loading: false });
    } catch (error) {
      if (mine === gen.current) setState((s) => ({ data: s.data, error, loading: false }));
    }
  }, deps);
  useEffect(() => {
    setState((s) => ({ ...s, loading: true }));
    run();
    const off = onAuth((a) => { if (!a.needToken) run(); });
    if (!every) return () => { gen.current++; off(); };
    const t = setInterval(() => { if (!document.hidden) run(); }, every);
    return () => { clearInterval(t); gen.current++; off(); };
  }, [run, every]);
  return { ...state, reload: run };
}

export function useAuth() {
  const [a, set] = useState({ ...auth });
  useEffect(() => onAuth(set), []);
  return a;
}

export const fmt = {
  n: (v) => (v === null || v === undefined ? '–' : Number(v).toLocaleString('en-US')),
  bytes: (v) => {
    if (v === null || v === undefined) return '–';
    const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB']; let i = 0; let x = Number(v);
    while (x >= 1024 && i < u.length - 1) { x /= 1024; i++; }
    return `${x.toFixed(i ? 1 : 0)} ${u[i]}`;
  },
  secs: (v) => {
    if (v === null || v === undefined) return '–';
    const s = Number(v);
    if (s < 1) return `${Math.round(s * 1000)} ms`;
    if (s < 120) return `${s.toFixed(1)} s`;
    if (s < 7200) return `${Math.round(s / 60)} min`;
    if (s < 172800) return `${(s / 3600).toFixed(1)} h`;
    return `${(s / 86400).toFixed(1)} d`;
  },
  time: (iso) => (iso ? new Date(iso).toISOString().replace('T', ' ').replace(/\.\d+Z$/, 'Z') : '–'),
  rel: (iso) => {
    if (!iso) return '';
    const d = (new Date(iso).getTime() - Date.now()) / 1000;
    return d >= 0 ? `in ${fmt.secs(d)}` : `${fmt.secs(-d)} ago`;
  },
  json: (v) => (v === undefined ? '' : JSON.stringify(v)),
};

export function ErrorLine({ error }) {
  if (!error) return null;
  return html`<div class="error" role="alert">${error.status ? `${error.status}: ` : ''}${error.message}</div>`;
}

export function Stat({ label, value, warn, testid }) {
  return html`<div class=${`stat${warn ? ' warn' : ''}`} data-testid=${testid}>
    <div class="v">${value}</div><div class="l">${label}</div></div>`;
}

export function Json({ value, short }) {
  const text = JSON.stringify(value, null, short ? 0 : 2);
  if (short) return html`<code class="json short" title=${text}>${text && text.length > 120 ? `${text.slice(0, 120)}…` : text}</code>`;
  return html`<pre class="json">${text}</pre>`;
}

// Offset paging: `total` known (most list routes) or unknown (keyset pages pass hasNext). A page that
// the answer budget stopped early carries nextOffset: the next page starts there, not at offset + limit.
export function Pager({ offset, limit, total, hasNext, nextOffset, onPage }) {
  const end = nextOffset ?? offset + limit;
  const last = total !== undefined ? Math.min(end, total) : end;
  const next = total !== undefined ? end < total : hasNext;
  return html`<div class="pager">
    <button disabled=${offset <= 0} onClick=${() => onPage(Math.max(0, offset - limit))}>‹ Prev</button>
    <span>${total === 0 ? 'none' : `${offset + 1}–${last}${total !== undefined ? ` of ${fmt.n(total)}` : ''}`}</span>
    <button disabled=${!next} onClick=${() => onPage(end)}>Next ›</button>
  </div>`;
}

// The one confirmation dialog: every destructive or state-changing action goes through it.
let openConfirm = null;
export function confirmAction(title, body, danger = true) {
  return new Promise((resolve) => openConfirm({ title, body, danger, resolve }));
}
export function ConfirmHost() {
  const [req, setReq] = useState(null);
  openConfirm = setReq;
  if (!req) return null;
  const done = (ok) => { setReq(null); req.resolve(ok); };
  return html`<div class="modal-back" onClick=${(e) => e.target === e.currentTarget && done(false)}>
    <div class="modal" role="dialog" aria-modal="true" data-testid="confirm">
      <h3>${req.title}</h3><p>${req.body}</p>
      <div class="actions">
        <button onClick=${() => done(false)}>Cancel</button>
        <button class=${req.danger ? 'danger' : 'primary'} data-testid="confirm-ok" onClick=${() => done(true)}>Confirm</button>
      </div></div></div>`;
}

// Toasts for the outcome of an action.
let pushToast = null;
export function toast(text, kind = 'ok') { if (pushToast) pushToast({ text, kind, id: Math.random() }); }
export function ToastHost() {
  const [items, setItems] = useState([]);
  pushToast = (t) => {
    setItems((xs) => [...xs, t]);
    setTimeout(() => setItems((xs) => xs.filter((x) => x.id !== t.id)), 4000);
  };
  return html`<div class="toasts">${items.map((t) => html`<div key=${t.id} class=${`toast ${t.kind}`}>${t.text}</div>`)}</div>`;
}

// Run an action, confirm first when asked, report the outcome, then refresh what depends on it.
export async function act({ confirm, run, ok, after }) {
  if (confirm && !(await confirmAction(confirm[0], confirm[1], confirm[2] !== false))) return false;
  try {
    const r = await run();
    toast(typeof ok === 'function' ? ok(r) : ok || 'Done');
    if (after) await after(r);
    return true;
  } catch (e) {
    toast(`${e.status ? `${e.status}: ` : ''}${e.message}`, 'bad');
    return false;
  }
}

// A button that only exists with write rights (hidden in read-only mode).
export function Danger({ children, class: cls, ...props }) {
  const a = useAuth();
  if (a.readOnly) return null;
  return html`<button ...${props} class=${`danger ${cls || ''}`}>${children}</button>`;
}
export function Write({ children, ...props }) {
  const a = useAuth();
  if (a.readOnly) return null;
  return html`<button ...${props}>${children}</button>`;
}

export function Empty({ children }) { return html`<div class="empty">${children}</div>`; }

export function link(path, params) {
  const u = new URLSearchParams();
  for (const [k, v] of Object.entries(params || {})) if (v !== undefined && v !== null && v !== '') u.set(k, v);
  const s = u.toString();
  return `#${path}${s ? `?${s}` : ''}`;
}
