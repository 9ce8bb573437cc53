#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Copyright The ipam-dev/ipam Authors
# ensure-postgres.sh: make sure the PostgreSQL server binaries (initdb,
# postgres) that internal/pgembed runs are installed, and print their
# directory on stdout (all other output goes to stderr).
#
# It looks where pgembed.FindBinDir looks: $IPAM_PG_BINDIR, the highest
# /usr/lib/postgresql/*/bin, then initdb or pg_ctl on $PATH. When nothing is
# found it installs PostgreSQL with apt-get if it runs as root on
# Debian/Ubuntu, and otherwise prints the one command to run and exits 1.
# As root it also makes sure the "postgres" OS user exists, because
# PostgreSQL refuses to run as root and pgembed runs it as that user.
set -euo pipefail

# has_server DIR: DIR holds executable initdb and postgres.
has_server() {
	[[ -x "$1/initdb" && -x "$1/postgres" ]]
}

# find_bindir: print the server binary directory, or fail quietly.
find_bindir() {
	if [[ -n "${IPAM_PG_BINDIR:-}" ]]; then
		has_server "$IPAM_PG_BINDIR" && { echo "$IPAM_PG_BINDIR"; return 0; }
		return 1
	fi
	local dir best=""
	for dir in $(compgen -G '/usr/lib/postgresql/*/bin' | sort -V); do
		has_server "$dir" && best=$dir
	done
	[[ -n "$best" ]] && { echo "$best"; return 0; }
	local name path
	for name in initdb pg_ctl; do
		path=$(command -v "$name" 2>/dev/null) || continue
		dir=$(dirname "$(readlink -f "$path")")
		has_server "$dir" && { echo "$dir"; return 0; }
	done
	return 1
}

ensure_postgres_user() {
	if [[ $(id -u) -eq 0 ]] && ! id -u postgres >/dev/null 2>&1; then
		echo "ensure-postgres: creating the postgres OS user" >&2
		useradd --system --no-create-home postgres >&2
	fi
}

if [[ -n "${IPAM_PG_BINDIR:-}" ]] && ! has_server "$IPAM_PG_BINDIR"; then
	echo "ensure-postgres: IPAM_PG_BINDIR=$IPAM_PG_BINDIR holds no initdb and postgres; fix or unset it" >&2
	exit 1
fi

if bindir=$(find_bindir); then
	ensure_postgres_user
	echo "$bindir"
	exit 0
fi

if [[ $(id -u) -ne 0 ]]; then
	echo "ensure-postgres: PostgreSQL server binaries (initdb, postgres) not found; install them with:" >&2
	if command -v apt-get >/dev/null 2>&1; then
		echo "sudo apt-get install -y postgresql postgresql-contrib" >&2
	else
		echo "your package manager's PostgreSQL server package (or set IPAM_PG_BINDIR)" >&2
	fi
	exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
	echo "ensure-postgres: PostgreSQL server binaries not found and apt-get is absent;" \
		"install the PostgreSQL server package with this system's package manager, or set IPAM_PG_BINDIR" >&2
	exit 1
fi

echo "ensure-postgres: installing PostgreSQL with apt-get" >&2
apt-get update >&2
# postgresql-contrib brings btree_gist on layouts where the server package
# lacks it; on Debian it is part of postgresql-NN and the extra is harmless.
DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends postgresql postgresql-contrib >&2
ensure_postgres_user
if ! bindir=$(find_bindir); then
	echo "ensure-postgres: apt-get installed postgresql but initdb is still not found" >&2
	exit 1
fi
echo "$bindir"
