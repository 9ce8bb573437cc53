// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

// The pool map: each CIDR of a pool family drawn as a grid of its
// block-sized slots, carved slots in their node's colour and free ones
// grey, so that fragmentation shows at a glance. The layout is pure (no
// DOM) so that its arithmetic reads on its own.
import { formatCIDR, formatIP, parseCIDR, parseIP, width } from './net.js';
import { s } from './dom.js';

/** The most cells a family's grids draw together; beyond, cells aggregate slots. */
export const MAX_CELLS = 1024;

/** Cells per CIDR: a power of two (so that a cell is a prefix), together at most MAX_CELLS, at least 64. */
export function cellBudget(cidrCount) {
  let b = MAX_CELLS;
  while (b > 64 && b * cidrCount > MAX_CELLS) b /= 2;
  return b;
}

/**
 * Places blocks on the slots of one pool CIDR.
 *
 * A slot is a prefix of maskSize. With more slots than budget, a cell
 * stands for 2^agg consecutive slots (itself a prefix of maskSize - agg),
 * and counts how many of them are carved, by which nodes, and how many a
 * reserved range keeps free. Blocks outside the CIDR are left out (the
 * caller counts what it placed).
 */
export function layoutCIDR(cidrText, maskSize, blocks, ranges, budget) {
  const c = parseCIDR(cidrText);
  const W = width(c.v);
  const slotBits = maskSize - c.bits;
  let agg = 0;
  while (2 ** (slotBits - agg) > budget) agg++;
  const cellBits = slotBits - agg;
  const slotShift = BigInt(W - maskSize);
  const cellShift = slotShift + BigInt(agg);
  const slotsPerCell = 2 ** agg;
  const end = c.n + (1n << BigInt(W - c.bits)); // exclusive
  const cells = Array.from({ length: 2 ** cellBits }, (_, i) => ({
    index: i,
    start: c.n + (BigInt(i) << cellShift),
    carved: 0,
    reserved: 0,
    nodes: new Map(),
    blocks: [],
  }));
  const placed = [];
  for (const b of blocks) {
    const p = parseCIDR(b.cidr);
    if (!p || p.v !== c.v || p.n < c.n || p.n >= end) continue;
    placed.push(b);
    const last = p.n + (1n << BigInt(W - p.bits)) - 1n;
    const first = Number((p.n - c.n) >> cellShift);
    const lastCell = Number(((last < end ? last : end - 1n) - c.n) >> cellShift);
    // A block of maskSize is one slot; a cloud's smaller block is part
    // of one, drawn as that slot.
    const slots = p.bits <= maskSize ? 2 ** (maskSize - p.bits) : 1;
    const share = slots / (lastCell - first + 1);
    for (let i = first; i <= lastCell; i++) {
      const cell = cells[i];
      cell.carved = Math.min(slotsPerCell, cell.carved + share);
      cell.nodes.set(b.node, (cell.nodes.get(b.node) || 0) + share);
      cell.blocks.push(b);
    }
  }
  for (const r of ranges || []) {
    const a = parseIP(r.start);
    const z = parseIP(r.end);
    if (!a || !z || a.v !== c.v) continue;
    const lo = a.n < c.n ? c.n : a.n;
    const hi = z.n >= end ? end - 1n : z.n;
    if (hi < lo) continue;
    const firstSlot = (lo - c.n) >> slotShift;
    const lastSlot = (hi - c.n) >> slotShift;
    const spc = 1n << BigInt(agg);
    for (let i = Number(firstSlot >> BigInt(agg)); i <= Number(lastSlot >> BigInt(agg)); i++) {
      const from = BigInt(i) * spc;
      const to = from + spc - 1n;
      const n = Number((to < lastSlot ? to : lastSlot) - (from > firstSlot ? from : firstSlot) + 1n);
      cells[i].reserved = Math.min(slotsPerCell, cells[i].reserved + n);
    }
  }
  return { cidr: cidrText, v: c.v, bits: c.bits, maskSize, slotBits, agg, cellBits, slotsPerCell, cells, placed };
}

/** What a cell shows: one node's, several nodes', reserved or free. */
export function cellState(cell) {
  if (cell.carved > 0) return cell.nodes.size === 1 ? 'node' : 'mixed';
  if (cell.reserved > 0) return 'reserved';
  return 'free';
}

/** The node holding most of a cell. */
function mainNode(cell) {
  let best = '';
  let most = -1;
  for (const [node, n] of cell.nodes) {
    if (n > most || (n === most && node < best)) {
      best = node;
      most = n;
    }
  }
  return best;
}

const fmt = new Intl.NumberFormat('en-US', { maximumFractionDigits: 1 });

function cellTitle(l, cell) {
  const prefix = formatCIDR(l.v, cell.start, l.maskSize - l.agg);
  if (l.agg === 0) {
    if (cell.blocks.length === 0) return `${prefix} · ${cell.reserved ? 'reserved range, not carved' : 'free'}`;
    return cell.blocks
      .map((b) => `${b.cidr} · ${b.node} · ${b.leased} of ${b.capacity} leased` + (b.cooling ? `, ${b.cooling} cooling` : '') + ` · ${b.source || 'carved'}`)
      .join('\n');
  }
  const nodes = [...cell.nodes].sort((a, b) => b[1] - a[1] || (a[0] < b[0] ? -1 : 1));
  const list = nodes.slice(0, 5).map(([n, k]) => `${n} ${fmt.format(k)}`).join(', ') + (nodes.length > 5 ? `, +${nodes.length - 5} nodes` : '');
  const free = l.slotsPerCell - cell.carved;
  return `${prefix} · ${fmt.format(l.slotsPerCell)} slots of /${l.maskSize}: ${fmt.format(cell.carved)} carved` +
    (list ? ` (${list})` : '') + `, ${fmt.format(free)} free` + (cell.reserved ? `, ${fmt.format(cell.reserved)} in reserved ranges` : '');
}

/**
 * Draws one layout as an SVG grid. colorOf(node) gives a node's colour,
 * href(node) its page.
 */
export function renderGrid(l, colorOf, href) {
  const n = l.cells.length;
  // Up to 512 cells in rows of 32 large cells, more in rows of 64; a
  // short CIDR's one row keeps the same cell size as its siblings.
  const cols = n <= 32 ? n : n <= 512 ? 32 : 64;
  const pitch = cols > 32 ? 16 : 26;
  const size = pitch - (cols > 32 ? 3 : 4);
  const rows = Math.ceil(n / cols);
  const rowBits = l.maskSize - l.agg - Math.log2(cols);
  const labels = Array.from({ length: rows }, (_, r) => {
    const start = l.cells[r * cols].start;
    return rows > 1 ? formatCIDR(l.v, start, Math.max(l.bits, rowBits)) : formatIP(l.v, start);
  });
  // Room for the longest row label in the 11px monospace font; an IPv4
  // grid leaves room for any IPv4 prefix, so that the grids of a family
  // line up.
  const chars = l.v === 4 ? 18 : Math.max(...labels.map((t) => t.length));
  const labelW = Math.ceil(chars * 6.7) + 14;
  const w = labelW + cols * pitch;
  const h = rows * pitch;
  const id = 'hatch-' + Math.random().toString(36).slice(2);
  const svg = s('svg', {
    class: 'grid', viewBox: `0 0 ${w} ${h}`, width: w, height: h, role: 'img',
    'aria-label': `Map of ${l.cidr}: ${n} cells`,
  });
  svg.append(s('defs', null, s('pattern', { id, width: 4, height: 4, patternUnits: 'userSpaceOnUse', patternTransform: 'rotate(45)' },
    s('rect', { width: 4, height: 4, class: 'hatch-bg' }), s('line', { x1: 0, y1: 0, x2: 0, y2: 4, class: 'hatch-line' }))));
  let carved = 0;
  labels.forEach((text, r) => svg.append(s('text', { x: labelW - 8, y: r * pitch + size / 2, class: 'row-label' }, text)));
  for (const cell of l.cells) {
    const st = cellState(cell);
    carved += cell.carved;
    const x = labelW + (cell.index % cols) * pitch;
    const y = Math.floor(cell.index / cols) * pitch;
    const node = st === 'node' || st === 'mixed' ? mainNode(cell) : '';
    const rect = s('rect', { x, y, width: size, height: size, rx: 2, class: 'cell ' + st, 'data-state': st === 'mixed' || st === 'node' ? 'carved' : st });
    if (st === 'node') rect.setAttribute('fill', colorOf(node));
    if (st === 'reserved') rect.setAttribute('fill', `url(#${id})`);
    if (l.agg > 0 && cell.carved > 0) rect.setAttribute('fill-opacity', String(0.35 + (0.65 * cell.carved) / l.slotsPerCell));
    if (node) rect.setAttribute('data-node', node);
    rect.setAttribute('data-prefix', formatCIDR(l.v, cell.start, l.maskSize - l.agg));
    rect.append(s('title', null, cellTitle(l, cell)));
    svg.append(node ? s('a', { href: href(node), 'aria-label': `${node}: ${cellTitle(l, cell)}` }, rect) : rect);
  }
  svg.setAttribute('data-cidr', l.cidr);
  svg.setAttribute('data-cells', String(n));
  svg.setAttribute('data-slots-per-cell', String(l.slotsPerCell));
  svg.setAttribute('data-carved', String(Math.round(carved)));
  return svg;
}
