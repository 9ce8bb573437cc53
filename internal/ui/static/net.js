// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

// Address arithmetic for the pool map: addresses as BigInt, so that IPv4
// and IPv6 take the same code and a /64 never loses precision.

/** Parses a dotted IPv4 address; null when s is not one. */
export function parseIPv4(s) {
  const parts = s.split('.');
  if (parts.length !== 4) return null;
  let n = 0n;
  for (const p of parts) {
    if (!/^\d{1,3}$/.test(p) || Number(p) > 255) return null;
    n = (n << 8n) | BigInt(Number(p));
  }
  return n;
}

/** Parses an IPv6 address (with :: and a trailing dotted quad); null when s is not one. */
export function parseIPv6(s) {
  if (!s.includes(':') || s.includes('%')) return null;
  const dbl = s.indexOf('::');
  if (dbl !== s.lastIndexOf('::')) return null;
  const groups = (str) => {
    if (str === '') return [];
    const out = [];
    const parts = str.split(':');
    for (let i = 0; i < parts.length; i++) {
      const p = parts[i];
      if (p.includes('.')) {
        const v4 = i === parts.length - 1 ? parseIPv4(p) : null;
        if (v4 === null) return null;
        out.push(Number(v4 >> 16n), Number(v4 & 0xffffn));
      } else if (/^[0-9a-fA-F]{1,4}$/.test(p)) {
        out.push(parseInt(p, 16));
      } else {
        return null;
      }
    }
    return out;
  };
  let words;
  if (dbl >= 0) {
    const left = groups(s.slice(0, dbl));
    const right = groups(s.slice(dbl + 2));
    if (left === null || right === null || left.length + right.length > 7) return null;
    words = [...left, ...new Array(8 - left.length - right.length).fill(0), ...right];
  } else {
    words = groups(s);
    if (words === null || words.length !== 8) return null;
  }
  let n = 0n;
  for (const w of words) n = (n << 16n) | BigInt(w);
  return n;
}

/** Parses an address of either family: {v: 4|6, n: BigInt}, or null. */
export function parseIP(s) {
  s = s.trim();
  const v4 = parseIPv4(s);
  if (v4 !== null) return { v: 4, n: v4 };
  const v6 = parseIPv6(s);
  if (v6 !== null) return { v: 6, n: v6 };
  return null;
}

/** Parses a CIDR: {v, n (the first address), bits (its prefix length)}, or null. */
export function parseCIDR(s) {
  const slash = s.indexOf('/');
  if (slash < 0) return null;
  const ip = parseIP(s.slice(0, slash));
  const bits = Number(s.slice(slash + 1));
  if (ip === null || !Number.isInteger(bits) || bits < 0 || bits > width(ip.v)) return null;
  const host = width(ip.v) - bits;
  return { v: ip.v, n: (ip.n >> BigInt(host)) << BigInt(host), bits };
}

/** The number of bits of an address of family v. */
export function width(v) {
  return v === 4 ? 32 : 128;
}

/** Formats an address as Go's netip does: dotted IPv4, RFC 5952 IPv6. */
export function formatIP(v, n) {
  if (v === 4) {
    return [24n, 16n, 8n, 0n].map((s) => String((n >> s) & 0xffn)).join('.');
  }
  const words = [];
  for (let i = 7; i >= 0; i--) words.push(Number((n >> BigInt(16 * i)) & 0xffffn));
  // The longest run of two or more zero words (the first of equals) becomes ::.
  let best = -1;
  let bestLen = 1;
  for (let i = 0; i < 8; ) {
    if (words[i] !== 0) {
      i++;
      continue;
    }
    let j = i;
    while (j < 8 && words[j] === 0) j++;
    if (j - i > bestLen) {
      best = i;
      bestLen = j - i;
    }
    i = j;
  }
  const hex = (ws) => ws.map((w) => w.toString(16)).join(':');
  if (best < 0) return hex(words);
  return hex(words.slice(0, best)) + '::' + hex(words.slice(best + bestLen));
}

/** Formats a prefix of family v starting at n. */
export function formatCIDR(v, n, bits) {
  return formatIP(v, n) + '/' + bits;
}
