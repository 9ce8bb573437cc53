// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

// The pools page (every pool's fill per family) and a pool's page (its
// figures, the map of its blocks, and its nodes).
import { get, getAll, mapLimit, ApiError } from './api.js';
import { h, num, pct, pctText, bar, numCell, table, badge, chips, pageHead, tile, time, swatch } from './dom.js';
import { cellBudget, layoutCIDR, renderGrid } from './map.js';

const FAMILIES = [['ipv4', 'IPv4'], ['ipv6', 'IPv6']];

/** Colours of nodes on the map; colour-blind safe first, then repeated. */
const PALETTE = ['#4e79a7', '#f28e2b', '#59a14f', '#e15759', '#76b7b2', '#b07aa1', '#edc948', '#9c755f', '#ff9da7', '#499894', '#86bcb6', '#d37295'];

/** The figures of one pool family: the capacity answer when there is one, else the pool's status. */
function figures(pool, cap, fam) {
  const c = cap && cap[fam];
  const st = (pool.status || {})[fam];
  if (c) return c;
  if (!st) return null;
  return { blocksPossible: st.blocksPossible, blocksCarved: st.blocksCarved, addressesInBlocks: st.addressesTotal, leased: st.leased, cooling: st.cooling, free: st.free };
}

function blocksBar(f) {
  return bar([{ value: f.blocksCarved, cls: 'carved' }], f.blocksPossible,
    `${num(f.blocksCarved)} of ${num(f.blocksPossible)} blocks carved (${pctText(pct(f.blocksCarved, f.blocksPossible))})`);
}

function addressBar(f) {
  return bar([{ value: f.leased, cls: 'leased' }, { value: f.cooling, cls: 'cooling' }], f.addressesInBlocks,
    `${num(f.leased)} leased and ${num(f.cooling)} cooling of ${num(f.addressesInBlocks)} addresses in blocks`);
}

/** The forecast in a few characters: time to full, else the growth rate, else nothing to say. */
function forecast(fc) {
  if (fc.hoursToFull !== undefined) return fc.hoursToFull < 48 ? `full in ${fc.hoursToFull.toFixed(1)} h` : `full in ${Math.round(fc.hoursToFull / 24)} d`;
  if (fc.samples >= 2) return `${fc.ratePerHour > 0 ? '+' : ''}${num(Math.round(fc.ratePerHour))} / h`;
  return '—';
}

/** The pools page. */
export async function poolsPage(ctx) {
  const { items: pools, truncated } = await getAll('/v1/pools', { space: ctx.space }, 10);
  const caps = await mapLimit(pools, 4, (p) =>
    get(`/v1/pools/${encodeURIComponent(p.name)}/capacity`, { space: ctx.space }).catch((e) => {
      if (e instanceof ApiError && e.status === 401) throw e;
      return null; // the pool's own status still gives the main figures
    }));
  const rows = [];
  pools.forEach((p, i) => {
    const fams = FAMILIES.filter(([fam]) => p.spec[fam]);
    fams.forEach(([fam, label], j) => {
      const f = figures(p, caps[i], fam);
      const spec = p.spec[fam];
      const row = h('tr', { 'data-pool': p.name, 'data-family': fam, class: j === 0 ? 'group-start' : null });
      if (j === 0) {
        row.append(h('th', { scope: 'row', rowspan: fams.length, class: 'pool-name' },
          h('a', { href: ctx.link(`/pools/${encodeURIComponent(p.name)}`) }, p.name),
          h('div', { class: 'cell-sub' }, badge(p.spec.mode || 'multi-pool', 'mode'), p.spec.disabled ? badge('disabled', 'warn') : null)));
      }
      row.append(
        h('td', null, badge(label, fam)),
        h('td', { class: 'mono cidrs' }, spec.cidrs.join(', ')),
        h('td', { class: 'num mono' }, '/' + spec.maskSize),
      );
      if (!f) {
        row.append(h('td', { colspan: 5, class: 'muted' }, 'no status'));
        rows.push(row);
        return;
      }
      row.append(
        h('td', { class: 'num fill' },
          h('div', { class: 'fill-text' }, h('span', { 'data-k': 'blocksCarved' }, num(f.blocksCarved)), h('span', { class: 'of' }, ' / '),
            h('span', { 'data-k': 'blocksPossible' }, num(f.blocksPossible))),
          blocksBar(f)),
        h('td', { class: 'num fill' },
          h('div', { class: 'fill-text' }, h('span', { 'data-k': 'leased' }, num(f.leased)), h('span', { class: 'of' }, ' / '),
            h('span', { 'data-k': 'addressesInBlocks' }, num(f.addressesInBlocks)),
            h('span', { class: 'pct' }, pctText(pct(f.leased + f.cooling, f.addressesInBlocks)))),
          addressBar(f)),
        numCell(f.cooling, 'cooling'),
        numCell(f.free, 'free'),
        h('td', { class: 'num' }, h('span', { 'data-k': 'nodesWithBlocks' }, num(f.nodesWithBlocks)),
          f.nodesAtCapacity ? h('div', { class: 'cell-sub' }, badge(`${num(f.nodesAtCapacity)} at capacity`, 'warn')) : null,
          f.nodesInDeficit ? h('div', { class: 'cell-sub' }, badge(`${num(f.nodesInDeficit)} in deficit`, 'warn')) : null),
      );
      rows.push(row);
    });
  });
  const body = pools.length === 0
    ? h('div', { class: 'empty' }, 'No pools in this space yet. Create one with POST /v1/pools.')
    : table([['Pool'], ['Family'], ['CIDRs'], ['Block', true], ['Blocks carved', true], ['Addresses leased', true], ['Cooling', true], ['Free', true], ['Nodes', true]],
      rows, { class: 'pools', 'data-testid': 'pools' });
  return {
    title: 'Pools',
    nodes: [
      pageHead('Pools', null, `${num(pools.length)} pool${pools.length === 1 ? '' : 's'} in space ${ctx.space}`),
      h('section', { class: 'card' }, body,
        truncated ? h('p', { class: 'note' }, 'Showing the first 10,000 pools.') : null,
        h('div', { class: 'legend inline' },
          h('span', null, h('i', { class: 'sw carved' }), 'blocks carved of the CIDRs'),
          h('span', null, h('i', { class: 'sw leased' }), 'addresses leased'),
          h('span', null, h('i', { class: 'sw cooling' }), 'cooling (released, not free yet)'))),
    ],
  };
}

/** A stable colour per node of the pool: by name, so a node keeps its colour between visits. */
function colours(blocks) {
  const names = [...new Set(blocks.map((b) => b.node))].sort();
  const m = new Map(names.map((n, i) => [n, PALETTE[i % PALETTE.length]]));
  return (n) => m.get(n) || '#888';
}

/** A pool's page. */
export async function poolPage(ctx, name) {
  const path = `/v1/pools/${encodeURIComponent(name)}`;
  const [pool, cap, blocks] = await Promise.all([
    get(path, { space: ctx.space }),
    get(path + '/capacity', { space: ctx.space }),
    getAll(path + '/blocks', { space: ctx.space }),
  ]);
  const colorOf = colours(blocks.items);
  const nodeHref = (n) => ctx.link(`/nodes/${encodeURIComponent(n)}`);
  const sections = [];
  for (const [fam, label] of FAMILIES) {
    const spec = pool.spec[fam];
    if (!spec) continue;
    const f = cap[fam] || figures(pool, null, fam);
    const famBlocks = blocks.items.filter((b) => b.family === fam);
    const ranges = new Map((spec.pool || []).map((pc) => [pc.cidr, pc.reservedRanges || []]));
    const budget = cellBudget(spec.cidrs.length);
    const grids = [];
    let placed = 0;
    let aggregated = false;
    for (const cidr of spec.cidrs) {
      const l = layoutCIDR(cidr, spec.maskSize, famBlocks, ranges.get(cidr), budget);
      placed += l.placed.length;
      aggregated ||= l.agg > 0;
      const slots = 2 ** l.slotBits;
      grids.push(h('figure', { class: 'map', 'data-cidr': cidr },
        h('figcaption', null, h('span', { class: 'mono strong' }, cidr),
          h('span', { class: 'muted' }, ` · ${num(slots)} slots of /${spec.maskSize} · ${num(l.placed.length)} carved`),
          l.agg > 0 ? h('span', { class: 'agg-note' }, ` · one cell per ${num(l.slotsPerCell)} slots (a /${spec.maskSize - l.agg}), to keep the map to ${num(l.cells.length)} cells`) : null),
        h('div', { class: 'grid-wrap' }, renderGrid(l, colorOf, nodeHref))));
    }
    const outside = famBlocks.length - placed;
    const nodes = [...new Set(famBlocks.map((b) => b.node))];
    sections.push(h('section', { class: 'card family', 'data-family': fam },
      h('h2', null, badge(label, fam), h('span', { class: 'h-sub' }, `${spec.cidrs.length} CIDR${spec.cidrs.length === 1 ? '' : 's'}, blocks of /${spec.maskSize}`)),
      h('div', { class: 'tiles' },
        tile('Blocks carved', [h('span', { 'data-k': 'blocksCarved' }, num(f.blocksCarved)), h('span', { class: 'of' }, ' / ' + num(f.blocksPossible))], null, blocksBar(f)),
        tile('Free blocks', h('span', { 'data-k': 'freeBlocks' }, num(f.freeBlocks)), null,
          f.largestFreeBlock ? ['largest free ', h('span', { class: 'mono' }, f.largestFreeBlock)] : 'none can be carved'),
        tile('Addresses leased', [h('span', { 'data-k': 'leased' }, num(f.leased)), h('span', { class: 'of' }, ' / ' + num(f.addressesInBlocks))], null, addressBar(f)),
        tile('Cooling · free', [h('span', { 'data-k': 'cooling' }, num(f.cooling)), h('span', { class: 'of' }, ' · '), h('span', { 'data-k': 'free' }, num(f.free))], null, 'addresses in carved blocks'),
        tile('Nodes with blocks', h('span', { 'data-k': 'nodesWithBlocks' }, num(f.nodesWithBlocks)), null,
          `${num(f.nodesAtCapacity)} at capacity · ${num(f.nodesInDeficit)} in deficit`),
        f.forecast ? tile('Forecast', h('span', { class: 'forecast' }, forecast(f.forecast)), null, f.forecast.summary) : null),
      grids,
      outside > 0 ? h('p', { class: 'note' }, `${num(outside)} blocks lie outside these CIDRs and are not drawn.`) : null,
      legend(nodes, famBlocks, colorOf, nodeHref, aggregated, grids)));
  }
  if (blocks.truncated) sections.push(h('p', { class: 'note' }, 'The pool has more than 50,000 blocks: the map shows the first 50,000.'));
  sections.push(h('section', { class: 'card' }, h('h2', null, 'Nodes in this pool'), nodeTable(ctx, blocks.items, colorOf)));
  const spec = pool.spec;
  return {
    title: `Pool ${pool.name}`,
    nodes: [
      pageHead(['Pool ', h('span', { class: 'mono' }, pool.name)],
        [badge(spec.mode || 'multi-pool', 'mode'), spec.disabled ? badge('disabled', 'warn') : null, spec.cloud ? badge(`cloud: ${spec.cloud.provider}`, 'mode') : null],
        [chips(pool.labels), h('span', { class: 'sep' }, '·'),
          spec.preAllocate !== undefined ? `pre-allocate ${spec.preAllocate} · ` : '',
          spec.maxBlocksPerNode ? `at most ${num(spec.maxBlocksPerNode)} blocks per node · ` : '',
          'created ', time(pool.createdAt)]),
      sections,
    ],
  };
}

/** The map's legend: the nodes' colours (most blocks first), then free, reserved and mixed cells. */
function legend(nodes, blocks, colorOf, nodeHref, aggregated, grids) {
  const count = new Map();
  for (const b of blocks) count.set(b.node, (count.get(b.node) || 0) + 1);
  const top = [...count].sort((a, b) => b[1] - a[1] || (a[0] < b[0] ? -1 : 1));
  const shown = top.slice(0, 12);
  const hasReserved = grids.some((g) => g.querySelector('[data-state="reserved"]'));
  const hasMixed = grids.some((g) => g.querySelector('.cell.mixed'));
  return h('div', { class: 'legend' },
    shown.map(([n, k]) => h('a', { href: nodeHref(n), class: 'legend-item', 'data-node': n, 'data-blocks': k },
      swatch(colorOf(n)), n, h('span', { class: 'muted' }, ` ${num(k)}`))),
    top.length > shown.length ? h('span', { class: 'legend-item muted' }, `+${num(top.length - shown.length)} more nodes (colours repeat)`) : null,
    h('span', { class: 'legend-item' }, h('i', { class: 'sw free' }), 'free'),
    hasReserved ? h('span', { class: 'legend-item' }, h('i', { class: 'sw reserved' }), 'reserved range') : null,
    hasMixed ? h('span', { class: 'legend-item' }, h('i', { class: 'sw mixed' }), 'several nodes') : null,
    aggregated ? h('span', { class: 'legend-item muted' }, 'paler: partly carved') : null,
    nodes.length === 0 ? h('span', { class: 'legend-item muted' }, 'no blocks carved yet') : null);
}

/** Per node and family: blocks, leased of capacity, cooling. */
function nodeTable(ctx, blocks, colorOf) {
  const by = new Map();
  for (const b of blocks) {
    const k = b.node + '\u0000' + b.family;
    const r = by.get(k) || { node: b.node, family: b.family, blocks: 0, leased: 0, cooling: 0, capacity: 0 };
    r.blocks++;
    r.leased += b.leased;
    r.cooling += b.cooling;
    r.capacity += b.capacity;
    by.set(k, r);
  }
  const rows = [...by.values()].sort((a, b) => (a.node < b.node ? -1 : a.node > b.node ? 1 : a.family < b.family ? -1 : 1));
  if (rows.length === 0) return h('div', { class: 'empty' }, 'No node holds a block of this pool.');
  return table([['Node'], ['Family'], ['Blocks', true], ['Leased', true], ['Capacity', true], ['Fill', true], ['Cooling', true]],
    rows.map((r) => {
      return h('tr', { 'data-node': r.node, 'data-family': r.family },
        h('td', null, swatch(colorOf(r.node)), h('a', { href: ctx.link(`/nodes/${encodeURIComponent(r.node)}`) }, r.node)),
        h('td', null, badge(r.family === 'ipv4' ? 'IPv4' : 'IPv6', r.family)),
        numCell(r.blocks, 'blocks'),
        numCell(r.leased, 'leased'),
        numCell(r.capacity, 'capacity'),
        h('td', { class: 'num fill' }, h('div', { class: 'fill-text' }, pctText(pct(r.leased + r.cooling, r.capacity))),
          bar([{ value: r.leased, cls: 'leased' }, { value: r.cooling, cls: 'cooling' }], r.capacity, `${r.leased} leased, ${r.cooling} cooling of ${r.capacity}`)),
        numCell(r.cooling, 'cooling'));
    }), { class: 'pool-nodes' });
}
