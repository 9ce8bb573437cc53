#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Copyright The ipam-dev/ipam Authors
# Prints the path of a promtool (Prometheus's rule checker), for the alert
# rules test. One on PATH wins; else the one unpacked before into
# .tools/bin; else Debian's prometheus package is downloaded (not
# installed: no service starts, nothing changes outside this checkout) and
# only its promtool is unpacked into .tools/bin.
set -euo pipefail
cd "$(dirname "$0")/.."
if command -v promtool >/dev/null; then command -v promtool; exit 0; fi
if [ -x .tools/bin/promtool ]; then echo "$PWD/.tools/bin/promtool"; exit 0; fi
command -v apt-get >/dev/null || { echo "promtool is missing and there is no apt-get: install Prometheus's promtool" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# apt-get download runs as any user once the package lists exist.
if ! (cd "$tmp" && apt-get download prometheus >&2 2>/dev/null); then
	[ "$(id -u)" = 0 ] || { echo "promtool is missing: sudo apt-get update, then run again (or apt-get install prometheus)" >&2; exit 1; }
	apt-get update >&2
	(cd "$tmp" && apt-get download prometheus >&2)
fi
dpkg-deb -x "$tmp"/prometheus_*.deb "$tmp/x"
mkdir -p .tools/bin
install -m 0755 "$tmp/x/usr/bin/promtool" .tools/bin/promtool
echo "$PWD/.tools/bin/promtool"
