#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Copyright The ipam-dev/ipam Authors
# Prints the path of a headless-capable Chromium, for the web view's
# browser test (internal/ui). One on PATH (chromium, chromium-browser) or
# $IPAM_CHROMIUM wins; else, as root on Debian/Ubuntu, Debian's chromium
# package is installed with apt-get. Otherwise it prints the command to run
# and exits 0: the browser test then skips on a developer's machine and
# fails under CI ($CI set).
set -euo pipefail

find_chromium() {
	if [[ -n ${IPAM_CHROMIUM:-} && -x ${IPAM_CHROMIUM} ]]; then
		echo "$IPAM_CHROMIUM"
		return 0
	fi
	local c
	for c in chromium chromium-browser; do
		if command -v "$c" >/dev/null 2>&1; then
			command -v "$c"
			return 0
		fi
	done
	return 1
}

if find_chromium; then
	exit 0
fi
if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
	echo "ensure-chromium: chromium is missing; the web view's browser test will skip. Install it with:" >&2
	echo "sudo apt-get install -y --no-install-recommends chromium" >&2
	exit 0
fi
echo "ensure-chromium: installing chromium with apt-get" >&2
# The package lists may be missing or stale on a fresh machine: update
# only when the first attempt fails.
if ! DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium >&2; then
	apt-get update >&2
	DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium >&2
fi
find_chromium || { echo "ensure-chromium: apt-get installed chromium but no chromium is on PATH" >&2; exit 1; }
