// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

// Building pages without markup strings: every value goes into the
// document as a text node or an attribute, never parsed as HTML, so a
// label or owner name can hold anything and stay text.

const SVG_NS = 'http://www.w3.org/2000/svg';

function set(el, attrs) {
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith('on') && typeof v === 'function') el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? '' : String(v));
  }
}

function fill(el, children) {
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : String(c));
  }
  return el;
}

/** An HTML element with attributes and children (nodes or text). */
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  set(el, attrs);
  return fill(el, children);
}

/** An SVG element, as h. */
export function s(tag, attrs, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  set(el, attrs);
  return fill(el, children);
}

const ints = new Intl.NumberFormat('en-US');

/** A count with thousands separators; huge IPv6 counts in scientific notation. */
export function num(n) {
  if (n === undefined || n === null) return '—';
  if (Math.abs(n) >= 1e15) return n.toExponential(2).replace('e+', 'e');
  return ints.format(n);
}

/** part of whole in percent, 0 when whole is 0. */
export function pct(part, whole) {
  return whole > 0 ? Math.min(100, (100 * part) / whole) : 0;
}

/** A percentage for reading: one decimal below 10 %, none above. */
export function pctText(p) {
  if (p > 0 && p < 0.1) return '<0.1%';
  return (p < 10 ? p.toFixed(1) : Math.round(p).toString()) + '%';
}

/**
 * A fill bar: segments [{value, cls, label}] over total. The widths go
 * through the CSSOM, which the Content-Security-Policy allows (a style
 * attribute it would refuse).
 */
export function bar(segments, total, label) {
  const el = h('div', { class: 'bar', role: 'img', 'aria-label': label, title: label });
  for (const sg of segments) {
    const part = h('span', { class: 'seg ' + sg.cls });
    part.style.width = pct(sg.value, total) + '%';
    el.append(part);
  }
  return el;
}

/** A number cell: right-aligned, tabular figures, data-k naming the figure for tests and scripts. */
export function numCell(value, key, extra) {
  return h('td', { class: 'num', 'data-k': key }, num(value), extra);
}

/** A table with a header row; cols are [label, numeric?]. */
export function table(cols, rows, attrs) {
  return h('div', { class: 'table-wrap' },
    h('table', attrs || {},
      h('thead', null, h('tr', null, cols.map(([label, isNum]) => h('th', { class: isNum ? 'num' : null, scope: 'col' }, label)))),
      h('tbody', null, rows)));
}

const dateFmt = new Intl.DateTimeFormat('en-GB', {
  year: 'numeric', month: 'short', day: '2-digit', hour: '2-digit', minute: '2-digit', second: '2-digit',
});

/** A time as a <time> element: local date and time, the exact instant in its title. */
export function time(iso) {
  if (!iso) return '—';
  const d = new Date(iso);
  return h('time', { datetime: iso, title: d.toISOString() }, dateFmt.format(d));
}

/** How long ago an instant was, roughly. */
export function ago(iso, now = Date.now()) {
  const secs = Math.round((now - new Date(iso).getTime()) / 1000);
  if (secs < 0) return 'in the future';
  if (secs < 90) return `${secs} s ago`;
  if (secs < 90 * 60) return `${Math.round(secs / 60)} min ago`;
  if (secs < 36 * 3600) return `${Math.round(secs / 3600)} h ago`;
  return `${Math.round(secs / 86400)} d ago`;
}

/** Label chips. */
export function chips(labels) {
  const entries = Object.entries(labels || {});
  if (entries.length === 0) return h('span', { class: 'muted' }, 'no labels');
  return h('span', { class: 'chips' }, entries.map(([k, v]) => h('span', { class: 'chip', title: `${k}=${v}` }, `${k}=${v}`)));
}

/** A small coloured badge. */
export function badge(text, cls) {
  return h('span', { class: 'badge ' + (cls || '') }, text);
}

/** A page header: title, optional badges and a subtitle. */
export function pageHead(title, badges, subtitle) {
  return h('div', { class: 'page-head' },
    h('h1', null, title, badges || []),
    subtitle ? h('p', { class: 'subtitle' }, subtitle) : null);
}

/** A figure tile: label, value and an optional line under it. */
export function tile(label, value, key, foot) {
  return h('div', { class: 'tile' },
    h('div', { class: 'tile-label' }, label),
    h('div', { class: 'tile-value', 'data-k': key }, value),
    foot ? h('div', { class: 'tile-foot' }, foot) : null);
}

/** A colour swatch (a node's colour on the map). */
export function swatch(color) {
  const el = h('i', { class: 'sw', 'aria-hidden': 'true' });
  el.style.backgroundColor = color;
  return el;
}
