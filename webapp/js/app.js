// The dashboard's shell: hash routing, navigation, the token prompt and the read-only banner.
import { render } from 'preact';
import { useEffect, useState } from 'preact/hooks';
import { probe, setToken, token } from './api.js';
import { ConfirmHost, ToastHost, html, useAuth } from './ui.js';
import { Overview } from './pages/overview.js';
import { QueuePage, Queues } from './pages/queues.js';
import { MessagePage, Messages } from './pages/messages.js';
import { DeadLetters } from './pages/dlq.js';
import { GroupPage, Groups } from './pages/groups.js';
import { Kv } from './pages/kv.js';
import { Timers } from './pages/timers.js';
import { Traces } from './pages/traces.js';

const NAV = [
  ['/', 'Overview'], ['/queues', 'Queues'], ['/messages', 'Messages'], ['/dlq', 'Dead letters'],
  ['/groups', 'Consumer groups'], ['/kv', 'KV'], ['/timers', 'Timers'], ['/traces', 'Traces'],
];

// path pattern -> page; `:x` captures one decoded segment, `*x` the rest
const ROUTES = [
  ['/', Overview], ['/queues', Queues], ['/queues/:queue', QueuePage], ['/messages', Messages],
  ['/messages/:pid/*txn', MessagePage], ['/dlq', DeadLetters], ['/groups', Groups], ['/groups/:group', GroupPage],
  ['/kv', Kv], ['/timers', Timers], ['/traces', Traces],
];

function parseHash() {
  const raw = location.hash.replace(/^#/, '') || '/';
  const [path, q = ''] = raw.split('?');
  return { path, query: Object.fromEntries(new URLSearchParams(q)) };
}

function match(path) {
  const segs = path.split('/').filter(Boolean);
  outer: for (const [pattern, page] of ROUTES) {
    const ps = pattern.split('/').filter(Boolean);
    const params = {};
    for (let i = 0; i < ps.length; i++) {
      if (i >= segs.length) continue outer;
      if (ps[i].startsWith('*')) {
        params[ps[i].slice(1)] = segs.slice(i).map(decodeURIComponent).join('/');
        return { page, params };
      }
      if (ps[i].startsWith(':')) params[ps[i].slice(1)] = decodeURIComponent(segs[i]);
      else if (ps[i] !== segs[i]) continue outer;
    }
    if (ps.length === segs.length) return { page, params };
  }
  return null;
}

function TokenPrompt() {
  const [value, setValue] = useState('');
  return html`<div class="modal-back"><form class="modal" data-testid="token-prompt"
      onSubmit=${(e) => { e.preventDefault(); setToken(value.trim()); }}>
    <h3>Sign in</h3>
    <p>The broker asks for a token (JWT). It is kept in this tab only (sessionStorage) and sent as
      <code>Authorization: Bearer</code> on every call.</p>
    <input type="password" autofocus placeholder="token" value=${value} data-testid="token-input"
      onInput=${(e) => setValue(e.target.value)} />
    <div class="actions"><button class="primary" type="submit">Use token</button></div>
  </form></div>`;
}

function App() {
  const [route, setRoute] = useState(parseHash());
  const a = useAuth();
  useEffect(() => {
    const on = () => setRoute(parseHash());
    addEventListener('hashchange', on);
    probe();
    return () => removeEventListener('hashchange', on);
  }, []);
  const m = match(route.path);
  const nav = (query) => {
    const u = new URLSearchParams();
    for (const [k, v] of Object.entries({ ...route.query, ...query })) if (v !== undefined && v !== null && v !== '') u.set(k, v);
    const s = u.toString();
    location.hash = `${route.path}${s ? `?${s}` : ''}`;
  };
  const section = `/${route.path.split('/')[1] || ''}`;
  const Page = m && m.page;
  return html`
    <header>
      <a class="brand" href="#/">queen-pg</a>
      <nav>${NAV.map(([p, label]) => html`<a href=${`#${p}`} class=${section === p ? 'on' : ''}>${label}</a>`)}</nav>
      <span class="right">
        ${a.readOnly && html`<span class="badge ro" data-testid="read-only">read-only</span>`}
        ${token() && html`<button class="link" onClick=${() => setToken('')}>Sign out</button>`}
        <a href="docs" target="_blank" rel="noopener">API</a>
      </span>
    </header>
    <main key=${a.epoch}>
      ${Page ? html`<${Page} ...${m.params} query=${route.query} nav=${nav} />`
             : html`<h2>Not found</h2><p>No page at <code>${route.path}</code>.</p>`}
    </main>
    ${a.needToken && html`<${TokenPrompt} />`}
    <${ConfirmHost} /><${ToastHost} />`;
}

render(html`<${App} />`, document.getElementById('app'));
