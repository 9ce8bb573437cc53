// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

// The address page: who holds an address now, and its history as a
// timeline of holdings (leased, then cooling) over the events the API
// recorded.
import { get, getOrNull } from './api.js';
import { h, s, badge, pageHead, time, ago, num } from './dom.js';
import { parseIP } from './net.js';

const KIND_LABEL = {
  lease: 'leased', confirm: 'confirmed', release: 'released', expire: 'expired unconfirmed',
  'cooldown-end': 'cooldown ended', 'block-carve': 'block carved', 'block-adopt': 'block adopted', 'block-release': 'block released',
};

/** The search form, on the address page and when no address is given. */
function searchForm(ctx, value) {
  const input = h('input', { type: 'search', name: 'address', value: value || '', placeholder: '10.244.0.5 or fd00:10:244::5', required: true,
    spellcheck: 'false', autocomplete: 'off', 'aria-label': 'Address' });
  const err = h('p', { class: 'error', role: 'alert' });
  return h('form', {
    class: 'search-big', onsubmit: (ev) => {
      ev.preventDefault();
      const ip = parseIP(input.value);
      if (!ip) {
        err.textContent = `${input.value} is not an IPv4 or IPv6 address.`;
        return;
      }
      location.hash = ctx.link(`/addresses/${encodeURIComponent(input.value.trim())}`);
    },
  }, input, h('button', { type: 'submit' }, 'Look up'), err);
}

/** The address page without an address. */
export async function searchPage(ctx) {
  return {
    title: 'Addresses',
    nodes: [pageHead('Addresses', null, 'Who holds an address, and everything that happened to it.'),
      h('section', { class: 'card' }, searchForm(ctx, ''))],
  };
}

/** Holdings of the address from its events, oldest first: {kind: held|cooling, from, to, ...}. */
export function holdings(events, holder, now) {
  const out = [];
  let held = null;
  let cool = null;
  for (const e of events) {
    const t = Date.parse(e.at);
    if (e.kind === 'lease') {
      if (cool) cool.to = t;
      if (held) held.to = t; // handed over in place
      cool = null;
      held = { kind: 'held', from: t, to: null, owner: e.owner, node: e.node, generation: e.generation, confirmed: null, end: null };
      out.push(held);
    } else if (e.kind === 'confirm' && held) {
      held.confirmed = t;
    } else if (e.kind === 'release' || e.kind === 'expire') {
      if (held) {
        held.to = t;
        held.end = e.kind;
      }
      held = null;
      if (e.state === 'cooling') {
        cool = { kind: 'cooling', from: t, to: null };
        out.push(cool);
      }
    } else if (e.kind === 'cooldown-end' && cool) {
      cool.to = t;
      cool = null;
    }
  }
  // A cooldown without its end event: over by its deadline when the
  // holder says so, else still running.
  if (cool && holder && holder.state === 'cooling' && holder.cooldownUntil) cool.to = Math.min(now, Date.parse(holder.cooldownUntil));
  else if (cool && !holder) cool.to = cool.from;
  for (const x of out) {
    x.open = x.to === null;
    if (x.open) x.to = now;
  }
  return out;
}

const tickFmt = new Intl.DateTimeFormat('en-GB', { month: 'short', day: '2-digit', hour: '2-digit', minute: '2-digit' });

/** The timeline: one lane of holdings over time, event marks under it, a time axis. */
function timeline(events, spans, now) {
  const W = 1000;
  const left = 10;
  const right = 10;
  // The axis ends now: an event dated later (a sticky address's
  // cooldown end is its binding's end) is drawn at the right edge.
  const t0 = Math.min(now, ...events.map((e) => Date.parse(e.at)));
  const t1 = now;
  const span = Math.max(t1 - t0, 60000);
  const x = (t) => left + ((W - left - right) * (Math.min(t, t1) - t0)) / span;
  const svg = s('svg', { class: 'timeline', viewBox: `0 0 ${W} 104`, role: 'img', 'aria-label': `Timeline of ${spans.length} holdings` });
  svg.append(s('line', { x1: left, x2: W - right, y1: 44, y2: 44, class: 'axis' }));
  for (const sp of spans) {
    const x0 = x(sp.from);
    const w = Math.max(3, x(sp.to) - x0);
    const title = sp.kind === 'held'
      ? `${sp.owner ? sp.owner.namespace + '/' + sp.owner.name : 'the node'} on ${sp.node}, ${new Date(sp.from).toISOString()} – ${sp.open ? 'now' : new Date(sp.to).toISOString()}`
      : `cooling ${new Date(sp.from).toISOString()} – ${sp.open ? 'now' : new Date(sp.to).toISOString()}`;
    svg.append(s('rect', { x: x0, y: sp.kind === 'held' ? 18 : 26, width: w, height: sp.kind === 'held' ? 20 : 12, rx: 3, class: 'span ' + sp.kind + (sp.open ? ' open' : ''), 'data-kind': sp.kind },
      s('title', null, title)));
    // The holder's name inside its bar, when the bar has room for it.
    const label = sp.kind === 'held' ? `${sp.owner ? sp.owner.name : 'node'} · ${sp.node}` : '';
    if (label && w > 7 * label.length + 16) svg.append(s('text', { x: x0 + 8, y: 29, class: 'span-label' }, label));
  }
  for (const e of events) {
    svg.append(s('circle', { cx: x(Date.parse(e.at)), cy: 56, r: 4, class: 'mark k-' + e.kind }, s('title', null, `${KIND_LABEL[e.kind] || e.kind} ${e.at}`)));
  }
  for (let i = 0; i <= 4; i++) {
    const t = t0 + (span * i) / 4;
    const tx = x(t);
    svg.append(s('line', { x1: tx, x2: tx, y1: 64, y2: 70, class: 'tick' }));
    svg.append(s('text', { x: tx, y: 86, class: 'tick-label', 'text-anchor': i === 0 ? 'start' : i === 4 ? 'end' : 'middle' }, i === 4 ? 'now' : tickFmt.format(new Date(t))));
  }
  return svg;
}

/** The address page. */
export async function addressPage(ctx, address) {
  const path = `/v1/addresses/${encodeURIComponent(address)}`;
  const [holder, hist] = await Promise.all([
    getOrNull(path, { space: ctx.space }),
    get(path + '/history', { space: ctx.space, limit: 1000 }),
  ]);
  const now = Date.now();
  const events = hist.items;
  const spans = holdings(events, holder, now);
  const nodeLink = (n) => h('a', { href: ctx.link(`/nodes/${encodeURIComponent(n)}`) }, n);
  const poolLink = (p) => h('a', { href: ctx.link(`/pools/${encodeURIComponent(p)}`) }, p);

  let holderCard;
  if (holder) {
    holderCard = h('section', { class: 'card holder', 'data-state': holder.state },
      h('h2', null, 'Held now ', badge(holder.state, 'state-' + holder.state)),
      h('dl', { class: 'facts' },
        h('dt', null, 'Owner'), h('dd', { 'data-k': 'owner' }, holder.owner ? `${holder.owner.namespace}/${holder.owner.name}` : 'the node itself (reserved)'),
        h('dt', null, 'Node'), h('dd', { 'data-k': 'node' }, nodeLink(holder.node)),
        h('dt', null, 'Pool · block'), h('dd', null, poolLink(holder.pool), ' · ', h('span', { class: 'mono' }, holder.block)),
        h('dt', null, 'Attachment'), h('dd', { class: 'mono' }, `${holder.containerID} ${holder.interface}` + (holder.network ? ` (network ${holder.network})` : '')),
        h('dt', null, 'Since'), h('dd', null, time(holder.createdAt), ` (${ago(holder.createdAt, now)})`),
        holder.cooldownUntil ? [h('dt', null, 'Cools until'), h('dd', null, time(holder.cooldownUntil))] : null,
        holder.expiresAt ? [h('dt', null, 'Expires'), h('dd', null, time(holder.expiresAt), ' unless confirmed')] : null,
        h('dt', null, 'Generation'), h('dd', { class: 'mono' }, String(holder.generation))));
  } else {
    holderCard = h('section', { class: 'card holder', 'data-state': 'free' },
      h('h2', null, 'Not held ', badge('free', 'state-free')),
      h('p', { class: 'muted' }, 'No lease holds this address now, and it is not cooling.'));
  }

  const list = [...events].reverse().map((e) => h('li', { class: 'event k-' + e.kind, 'data-kind': e.kind },
    h('span', { class: 'dot', 'aria-hidden': 'true' }),
    h('div', { class: 'event-head' }, h('strong', null, KIND_LABEL[e.kind] || e.kind), ' ', time(e.at),
      e.state ? badge(e.state, 'state-' + e.state) : null),
    h('div', { class: 'event-body' },
      e.owner ? h('span', null, `${e.owner.namespace}/${e.owner.name}`) : null,
      e.node ? h('span', null, 'node ', nodeLink(e.node)) : null,
      e.pool ? h('span', null, 'pool ', poolLink(e.pool)) : null,
      e.containerID ? h('span', { class: 'mono' }, `${e.containerID.slice(0, 12)} ${e.interface || ''}`) : null,
      h('span', null, 'by ', h('span', { class: 'mono' }, e.actor)),
      e.reason ? h('span', { class: 'muted' }, e.reason) : null,
      e.generation ? h('span', { class: 'muted mono' }, `gen ${e.generation}`) : null)));

  return {
    title: address,
    nodes: [
      pageHead(['Address ', h('span', { class: 'mono' }, address)], null, searchForm(ctx, address)),
      holderCard,
      h('section', { class: 'card' },
        h('h2', null, 'History', h('span', { class: 'h-sub', 'data-k': 'events' }, `${num(events.length)} event${events.length === 1 ? '' : 's'}`)),
        events.length === 0 ? h('div', { class: 'empty' }, 'No recorded event: the address was never leased, or its history is older than the retention.') : [
          h('div', { class: 'timeline-wrap' }, timeline(events, spans, now)),
          h('div', { class: 'legend inline' },
            h('span', null, h('i', { class: 'sw leased' }), 'held'),
            h('span', null, h('i', { class: 'sw cooling' }), 'cooling'),
            h('span', null, h('i', { class: 'sw dot-lease' }), 'lease'),
            h('span', null, h('i', { class: 'sw dot-release' }), 'release'),
            h('span', null, h('i', { class: 'sw dot-other' }), 'other events')),
          h('ol', { class: 'events', reversed: true }, list),
          hist.continue ? h('p', { class: 'note' }, 'Showing the first 1,000 events, newest first.') : null,
        ]),
    ],
  };
}
