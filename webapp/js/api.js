// The only door to the broker: the public HTTP API, relative to the page (works behind a path prefix).
// Auth contract: a 401 asks for a token (kept in sessionStorage, sent as Authorization: Bearer on every
// call); a 403 on a write, or on the admin probe, switches the dashboard to read-only mode.
const TOKEN_KEY = 'queen.token';
const listeners = new Set();
export const auth = { needToken: false, readOnly: false, epoch: 0 };

export function onAuth(fn) { listeners.add(fn); return () => listeners.delete(fn); }
function changed() { for (const fn of listeners) fn({ ...auth }); }

export function token() { return sessionStorage.getItem(TOKEN_KEY) || ''; }
export function setToken(t) {
  if (t) sessionStorage.setItem(TOKEN_KEY, t); else sessionStorage.removeItem(TOKEN_KEY);
  auth.needToken = false; auth.readOnly = false; auth.epoch++;
  changed();
  probe();
}

export class ApiError extends Error {
  constructor(status, body) {
    super((body && (body.detail || body.error)) || `HTTP ${status}`);
    this.status = status; this.body = body;
  }
}

export function qs(params) {
  const u = new URLSearchParams();
  for (const [k, v] of Object.entries(params || {})) if (v !== undefined && v !== null && v !== '') u.set(k, v);
  const s = u.toString();
  return s ? `?${s}` : '';
}

export const enc = encodeURIComponent;

export async function api(method, path, body) {
  const headers = { Accept: 'application/json' };
  const t = token();
  if (t) headers.Authorization = `Bearer ${t}`;
  const init = { method, headers };
  if (body !== undefined) { headers['Content-Type'] = 'application/json'; init.body = JSON.stringify(body); }
  let res = await fetch(`api/v1/${path}`, init);
  // 503 + Retry-After means "nothing was done, try again" (e.g. a dead letter still being copied out of
  // its segment): an action retries a few times by itself before it reports the error
  for (let i = 0; i < 3 && res.status === 503 && res.headers.get('Retry-After'); i++) {
    await new Promise((ok) => setTimeout(ok, Math.min(Number(res.headers.get('Retry-After')) || 1, 2) * 1000));
    res = await fetch(`api/v1/${path}`, init);
  }
  const text = await res.text();
  let data = null;
  try { data = text ? JSON.parse(text) : null; } catch { data = { error: text }; }
  if (res.status === 401) {
    if (!auth.needToken) { auth.needToken = true; changed(); }
    throw new ApiError(401, data);
  }
  // a 403 on the system-wide maintenance switches is about the tenant (only the default tenant's admin
  // may flip them), not the token's level: it stays an error on the page and does not mean read-only
  if (res.status === 403 && method !== 'GET' && !path.startsWith('system/')) {
    if (!auth.readOnly) { auth.readOnly = true; changed(); }
  }
  if (!res.ok) throw new ApiError(res.status, data);
  return data;
}

export const get = (path, params) => api('GET', path + qs(params));
export const post = (path, body) => api('POST', path, body);
export const del = (path, params) => api('DELETE', path + qs(params));

// The admin probe: POST /api/v1/stats/refresh is a no-op kept for clients; a token that may not write
// answers 403 there, and the destructive buttons disappear.
export async function probe() {
  try { await post('stats/refresh'); }
  catch (e) { if (e.status === 403 && !auth.readOnly) { auth.readOnly = true; changed(); } }
}
