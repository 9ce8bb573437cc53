#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Copyright The ipam-dev/ipam Authors
# ensure-pg-auto-failover.sh: make sure pg_auto_failover (the pg_autoctl
# command and the pgautofailover extension of the PostgreSQL version that
# ensure-postgres.sh finds) is installed, for the failover tests of
# internal/faulttest (ha_test.go). As root on Debian/Ubuntu it installs the
# packages pg-auto-failover-cli and postgresql-NN-auto-failover with
# apt-get; otherwise it prints the command to run and exits 0: those tests
# then skip on a developer's machine and fail under CI.
set -euo pipefail
cd "$(dirname "$0")/.."

bindir=$(scripts/ensure-postgres.sh)
version=$(basename "$(dirname "$bindir")")

# has_extension: the monitor's and the nodes' extension is installed for
# this PostgreSQL version.
has_extension() {
	local share
	share=$("$bindir/pg_config" --sharedir 2>/dev/null || echo "/usr/share/postgresql/$version")
	[[ -f "$share/extension/pgautofailover.control" ]]
}

if command -v pg_autoctl >/dev/null 2>&1 && has_extension; then
	exit 0
fi
packages="pg-auto-failover-cli postgresql-$version-auto-failover"
if [[ $(id -u) -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
	echo "ensure-pg-auto-failover: pg_auto_failover for PostgreSQL $version is missing; the failover tests will skip. Install it with:" >&2
	echo "sudo apt-get install -y $packages" >&2
	exit 0
fi
echo "ensure-pg-auto-failover: installing $packages with apt-get" >&2
if ! DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $packages >&2; then
	apt-get update >&2
	DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $packages >&2
fi
if ! command -v pg_autoctl >/dev/null 2>&1 || ! has_extension; then
	echo "ensure-pg-auto-failover: apt-get installed $packages but pg_autoctl or the extension is still missing" >&2
	exit 1
fi
