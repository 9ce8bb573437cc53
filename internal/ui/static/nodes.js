// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

// The nodes page and a node's page: its blocks, its demand per pool, and
// the addresses it holds.
import { get, getAll } from './api.js';
import { h, num, pct, pctText, bar, numCell, table, badge, chips, pageHead, tile, time, ago } from './dom.js';

const famLabel = (f) => (f === 'ipv4' ? 'IPv4' : 'IPv6');

function addressLink(ctx, addr) {
  const ip = addr.split('/')[0];
  return h('a', { href: ctx.link(`/addresses/${encodeURIComponent(ip)}`), class: 'mono' }, addr);
}

/** The nodes page. */
export async function nodesPage(ctx) {
  const { items, truncated } = await getAll('/v1/nodes', { space: ctx.space }, 10);
  const rows = items.map((n) => {
    const internal = (n.addresses || []).find((a) => a.type === 'InternalIP');
    const zone = (n.labels || {})['topology.kubernetes.io/zone'];
    return h('tr', { 'data-node': n.name },
      h('td', null, h('a', { href: ctx.link(`/nodes/${encodeURIComponent(n.name)}`) }, n.name)),
      h('td', { class: 'mono' }, internal ? internal.address : '—'),
      h('td', null, zone || h('span', { class: 'muted' }, '—')),
      numCell(n.blocks, 'blocks'),
      numCell(n.leases, 'leases'),
      h('td', { class: 'num' }, time(n.createdAt)));
  });
  return {
    title: 'Nodes',
    nodes: [
      pageHead('Nodes', null, `${num(items.length)} node${items.length === 1 ? '' : 's'} in space ${ctx.space}`),
      h('section', { class: 'card' },
        items.length === 0 ? h('div', { class: 'empty' }, 'No nodes yet: a node is registered by PUT /v1/nodes/{node} or on its first lease.')
          : table([['Node'], ['Internal IP'], ['Zone'], ['Blocks', true], ['Leases', true], ['Registered', true]], rows, { class: 'nodes' }),
        truncated ? h('p', { class: 'note' }, 'Showing the first 10,000 nodes.') : null),
    ],
  };
}

/** A node's page. */
export async function nodePage(ctx, name) {
  const path = `/v1/nodes/${encodeURIComponent(name)}`;
  const q = { space: ctx.space };
  const [node, usage, blocks, leases] = await Promise.all([
    get(path, q),
    get(path + '/pools', q),
    get(path + '/blocks', q),
    get('/v1/leases', { ...q, node: name, limit: 200 }),
  ]);
  const capacity = blocks.items.reduce((a, b) => a + b.capacity, 0);
  const leased = blocks.items.reduce((a, b) => a + b.leased, 0);
  const cooling = blocks.items.reduce((a, b) => a + b.cooling, 0);
  const poolLink = (p) => h('a', { href: ctx.link(`/pools/${encodeURIComponent(p)}`) }, p);

  const demandRows = usage.items.map((u) => h('tr', { 'data-pool': u.pool, 'data-family': u.family },
    h('td', null, poolLink(u.pool)),
    h('td', null, badge(famLabel(u.family), u.family)),
    h('td', null, badge(u.mode, 'mode')),
    numCell(u.blocks, 'blocks'),
    numCell(u.capacity, 'capacity'),
    numCell(u.leased, 'leased'),
    numCell(u.released, 'released'),
    numCell(u.needed, 'needed'),
    numCell(u.available, 'available'),
    h('td', { class: 'num', 'data-k': 'deficit' }, u.deficit > 0 ? badge(num(u.deficit), 'warn') : '0'),
    h('td', null, u.atCapacity ? badge('at capacity', 'warn') : u.canLease ? badge('can lease', 'ok') : badge('cannot lease', 'bad'))));

  const blockRows = blocks.items.map((b) => h('tr', { 'data-cidr': b.cidr },
    h('td', { class: 'mono strong' }, b.cidr),
    h('td', null, poolLink(b.pool)),
    h('td', null, badge(famLabel(b.family), b.family)),
    h('td', null, b.source || 'carved'),
    h('td', null, b.gateway ? addressLink(ctx, b.gateway) : h('span', { class: 'muted' }, '—')),
    numCell(b.leased, 'leased'),
    numCell(b.capacity, 'capacity'),
    h('td', { class: 'num fill' }, h('div', { class: 'fill-text' }, pctText(pct(b.leased + b.cooling, b.capacity))),
      bar([{ value: b.leased, cls: 'leased' }, { value: b.cooling, cls: 'cooling' }], b.capacity, `${b.leased} leased, ${b.cooling} cooling of ${b.capacity}`)),
    numCell(b.cooling, 'cooling'),
    h('td', { class: 'num' }, time(b.createdAt))));

  const leaseRows = leases.items.map((l) => h('tr', { 'data-address': l.address.split('/')[0] },
    h('td', null, addressLink(ctx, l.address.split('/')[0])),
    h('td', null, badge(famLabel(l.family), l.family)),
    h('td', null, poolLink(l.pool)),
    h('td', null, l.owner ? `${l.owner.namespace}/${l.owner.name}` : h('span', { class: 'muted' }, 'the node')),
    h('td', { class: 'mono small' }, `${l.containerID.slice(0, 12)} ${l.interface}`),
    h('td', null, badge(l.state, 'state-' + l.state)),
    h('td', { class: 'num', title: l.createdAt }, ago(l.createdAt))));

  const internal = (node.addresses || []).map((a) => `${a.type} ${a.address}`).join(' · ');
  return {
    title: `Node ${node.name}`,
    nodes: [
      pageHead(['Node ', h('span', { class: 'mono' }, node.name)], null,
        [chips(node.labels), internal ? [h('span', { class: 'sep' }, '·'), h('span', { class: 'mono' }, internal)] : null,
          node.providerID ? [h('span', { class: 'sep' }, '·'), h('span', { class: 'mono' }, node.providerID)] : null,
          h('span', { class: 'sep' }, '·'), 'registered ', time(node.createdAt)]),
      h('section', { class: 'card' },
        h('div', { class: 'tiles' },
          tile('Blocks', h('span', { 'data-k': 'blocks' }, num(node.blocks))),
          tile('Leases', h('span', { 'data-k': 'leases' }, num(node.leases)), null, 'pending and active'),
          tile('Addresses in blocks', [h('span', { 'data-k': 'leasedInBlocks' }, num(leased)), h('span', { class: 'of' }, ' / ' + num(capacity))], null,
            bar([{ value: leased, cls: 'leased' }, { value: cooling, cls: 'cooling' }], capacity, `${leased} leased, ${cooling} cooling of ${capacity}`)),
          tile('Cooling', h('span', { 'data-k': 'cooling' }, num(cooling)), null, 'released, not free yet'))),
      h('section', { class: 'card' }, h('h2', null, 'Demand per pool', h('span', { class: 'h-sub' }, 'needed = neededIPCeil(leased + released, preAllocate)')),
        demandRows.length ? table([['Pool'], ['Family'], ['Mode'], ['Blocks', true], ['Capacity', true], ['Leased', true], ['Released', true],
          ['Needed', true], ['Available', true], ['Deficit', true], ['Lease now']], demandRows, { class: 'demand' })
          : h('div', { class: 'empty' }, 'The node uses no pool yet.')),
      h('section', { class: 'card' }, h('h2', null, 'Blocks'),
        blockRows.length ? table([['CIDR'], ['Pool'], ['Family'], ['Source'], ['Gateway'], ['Leased', true], ['Capacity', true], ['Fill', true], ['Cooling', true], ['Since', true]],
          blockRows, { class: 'blocks' }) : h('div', { class: 'empty' }, 'The node holds no block.')),
      h('section', { class: 'card' }, h('h2', null, 'Addresses', h('span', { class: 'h-sub' }, 'leased, reserved and cooling')),
        leaseRows.length ? table([['Address'], ['Family'], ['Pool'], ['Owner'], ['Container'], ['State'], ['Since', true]], leaseRows, { class: 'leases' })
          : h('div', { class: 'empty' }, 'The node holds no address.'),
        leases.continue ? h('p', { class: 'note' }, 'Showing the first 200 addresses, by address.') : null),
    ],
  };
}
