// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

// The web view's entry: a hash router (#/pools, #/pools/NAME,
// #/nodes/NAME, #/addresses/ADDR, each with ?space=), the header, and the
// sign-in form shown whenever the API answers 401.
import { ApiError, get, signIn, signOut } from './api.js';
import { h } from './dom.js';
import { parseIP } from './net.js';
import { poolsPage, poolPage } from './pools.js';
import { nodesPage, nodePage } from './nodes.js';
import { searchPage, addressPage } from './address.js';

const routes = [
  [/^\/?$/, 'pools', poolsPage],
  [/^\/pools$/, 'pools', poolsPage],
  [/^\/pools\/([^/]+)$/, 'pools', poolPage],
  [/^\/nodes$/, 'nodes', nodesPage],
  [/^\/nodes\/([^/]+)$/, 'nodes', nodePage],
  [/^\/addresses$/, 'addresses', searchPage],
  [/^\/addresses\/([^/]+)$/, 'addresses', addressPage],
];

const main = document.getElementById('main');
let generation = 0; // the render in progress; an older one's answer is dropped

/** The route of the location's fragment: path, space and the link maker that keeps the space. */
function current() {
  const frag = location.hash.replace(/^#/, '');
  const [path, query] = frag.split('?');
  const space = new URLSearchParams(query || '').get('space') || 'default';
  const link = (p) => '#' + p + (space === 'default' ? '' : '?space=' + encodeURIComponent(space));
  return { path: path || '/', space, link };
}

async function render() {
  const gen = ++generation;
  const ctx = current();
  const match = routes.map(([re, nav, page]) => [ctx.path.match(re), nav, page]).find(([m]) => m);
  document.querySelectorAll('[data-nav]').forEach((a) => {
    a.setAttribute('href', ctx.link('/' + a.dataset.nav));
    if (match && a.dataset.nav === match[1]) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  });
  main.setAttribute('aria-busy', 'true');
  let view;
  try {
    if (!match) throw new ApiError(404, { title: 'No such page', detail: `Nothing is at #${ctx.path}.` });
    const [m, , page] = match;
    view = await page(ctx, ...m.slice(1).map(decodeURIComponent));
  } catch (e) {
    view = e instanceof ApiError && e.status === 401 ? signInView(e) : errorView(e);
  }
  if (gen !== generation) return;
  document.title = `${view.title} · IPAM`;
  // Signed out, the header's sign-out and search have nothing to act on.
  document.body.dataset.auth = view.signIn ? 'none' : 'ok';
  main.replaceChildren(...[view.nodes].flat(Infinity).filter(Boolean));
  main.setAttribute('aria-busy', 'false');
  main.dataset.page = view.title;
  spaces(ctx);
}

function errorView(e) {
  const p = e instanceof ApiError ? e.problem : {};
  const status = e instanceof ApiError ? e.status : 0;
  const title = status === 403 ? 'Not allowed' : status === 404 ? 'Not found' : p.title || 'Something went wrong';
  return {
    title,
    nodes: h('section', { class: 'card problem', 'data-status': String(status) },
      h('h1', null, title),
      h('p', null, e.message || String(e)),
      p.type ? h('p', { class: 'muted mono small' }, `${status} ${p.type}` + (p.field ? ` · field ${p.field}` : '')) : null,
      status === 403 ? h('p', { class: 'muted' }, 'Your credentials are valid but their role may not read this; sign in with another token.') : null,
      h('p', null, h('a', { href: current().link('/pools') }, 'Back to the pools'))),
  };
}

/** The sign-in form: a token becomes an HttpOnly cookie that authorizes reads only. */
function signInView(e) {
  const input = h('input', { type: 'password', name: 'token', id: 'token', required: true, autocomplete: 'off', spellcheck: 'false', placeholder: 'ipam_…' });
  const err = h('p', { class: 'error', role: 'alert' });
  const button = h('button', { type: 'submit' }, 'Sign in');
  const form = h('form', {
    method: 'post', action: 'session', class: 'signin-form', onsubmit: async (ev) => {
      ev.preventDefault();
      button.disabled = true;
      err.textContent = '';
      try {
        await signIn(input.value.trim());
        input.value = '';
        await render();
      } catch (x) {
        err.textContent = x.message;
        button.disabled = false;
      }
    },
  }, h('label', { for: 'token' }, 'API token'), input, button, err);
  return {
    title: 'Sign in',
    signIn: true,
    nodes: h('section', { class: 'card signin' },
      h('h1', null, 'Sign in'),
      h('p', { class: 'muted small' }, 'The API answered 401: ', e.message),
      h('p', null, 'Paste an API token with the role viewer or above. It is kept in an HttpOnly cookie of this site that authorizes reads only, for 12 hours at most.'),
      form,
      h('p', { class: 'muted small' }, 'A client certificate of the service’s CA, imported into the browser, works without signing in.')),
  };
}

/** The space selector, shown when there is more than one space; filled once. */
let spacesLoaded = false;
async function spaces(ctx) {
  const sel = document.getElementById('space');
  if (!spacesLoaded) {
    try {
      const list = await get('/v1/spaces', { limit: 1000 });
      spacesLoaded = true;
      sel.replaceChildren(...list.items.map((sp) => h('option', { value: sp.name }, sp.name)));
      sel.closest('label').hidden = list.items.length < 2;
    } catch {
      return; // signed out, or not allowed: the selector stays hidden
    }
  }
  sel.value = ctx.space;
}

document.getElementById('space').addEventListener('change', (ev) => {
  const sp = ev.target.value;
  location.hash = '#/pools' + (sp === 'default' ? '' : '?space=' + encodeURIComponent(sp));
});

document.getElementById('search').addEventListener('submit', (ev) => {
  ev.preventDefault();
  const q = ev.target.elements.q.value.trim();
  if (!q) return;
  const ctx = current();
  location.hash = ctx.link((parseIP(q) ? '/addresses/' : '/nodes/') + encodeURIComponent(q));
  ev.target.elements.q.value = '';
});

document.getElementById('signout').addEventListener('click', async () => {
  try {
    await signOut();
  } finally {
    spacesLoaded = false;
    await render();
  }
});

window.addEventListener('hashchange', render);
render();
