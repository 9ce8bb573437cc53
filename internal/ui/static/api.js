// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

// The REST API as this view uses it: GETs of /v1 with the browser's own
// credentials (a client certificate, or the session cookie), and the
// sign-in and sign-out of that cookie. Every error is the API's
// problem+json, kept whole in ApiError.

/** An answer other than 2xx, with the API's problem (type, title, detail, field). */
export class ApiError extends Error {
  constructor(status, problem, path) {
    super((problem && (problem.detail || problem.title)) || `HTTP ${status}`);
    this.status = status;
    this.problem = problem || {};
    this.path = path;
  }
}

// The API's paths are resolved against the page (/ui/), so the view works
// behind a proxy that serves the service under a path prefix.
function url(path, params) {
  const u = new URL('..' + path, document.baseURI);
  for (const [k, v] of Object.entries(params || {})) {
    if (v !== undefined && v !== null && v !== '') u.searchParams.append(k, String(v));
  }
  return u;
}

async function answer(res, path) {
  const text = await res.text();
  let body = {};
  if (text) {
    try {
      body = JSON.parse(text);
    } catch {
      body = { title: `HTTP ${res.status}`, detail: text.slice(0, 300) };
    }
  }
  if (!res.ok) throw new ApiError(res.status, body, path);
  return body;
}

/** GET path (e.g. /v1/pools) with query params; the decoded JSON answer. */
export async function get(path, params) {
  const res = await fetch(url(path, params), {
    headers: { Accept: 'application/json' },
    credentials: 'same-origin',
    cache: 'no-store',
  });
  return answer(res, path);
}

/**
 * Every item of a paged list, following `continue` for at most maxPages
 * pages of 1000: {items, truncated}.
 */
export async function getAll(path, params, maxPages = 50) {
  const items = [];
  let cont;
  let pages = 0;
  do {
    const page = await get(path, { ...params, limit: 1000, continue: cont });
    items.push(...page.items);
    cont = page.continue;
    pages++;
  } while (cont && pages < maxPages);
  return { items, truncated: Boolean(cont) };
}

/** GET, answering null for a 404 (an address nobody holds). */
export async function getOrNull(path, params) {
  try {
    return await get(path, params);
  } catch (e) {
    if (e instanceof ApiError && e.status === 404) return null;
    throw e;
  }
}

/** Signs a token in: the server sets it as an HttpOnly cookie for reads. */
export async function signIn(token) {
  const res = await fetch(new URL('session', document.baseURI), {
    method: 'POST',
    headers: { 'Content-Type': 'application/json', Accept: 'application/json' },
    credentials: 'same-origin',
    body: JSON.stringify({ token }),
  });
  await answer(res, '/ui/session');
}

/** Drops the session cookie. */
export async function signOut() {
  const res = await fetch(new URL('session', document.baseURI), { method: 'DELETE', credentials: 'same-origin' });
  await answer(res, '/ui/session');
}

/** Runs fn over items with at most n at once, keeping their order. */
export async function mapLimit(items, n, fn) {
  const out = new Array(items.length);
  let next = 0;
  const worker = async () => {
    while (next < items.length) {
      const i = next++;
      out[i] = await fn(items[i], i);
    }
  };
  await Promise.all(Array.from({ length: Math.min(n, items.length) }, worker));
  return out;
}
