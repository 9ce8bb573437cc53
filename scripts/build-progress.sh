#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Copyright The ipam-dev/ipam Authors
# build-progress.sh OUTPUT PACKAGE: go build PACKAGE into OUTPUT and say what
# is happening while it compiles. A cold build of the server compiles about
# 1,400 packages (the Kubernetes client, OpenTelemetry, the cloud SDKs):
# minutes on two cores, silent with a plain `go build`. A warm build prints
# one line. Progress goes to stderr: one updating line on a terminal, a line
# every 100 packages otherwise.
set -euo pipefail
out=$1
pkg=$2
GO=${GO:-go}

say() { echo "build: $*" >&2; }

mkdir -p "$(dirname "$out")"
statusfile=$(mktemp)
trap 'rm -f "$statusfile"' EXIT
began=$(date +%s)
say "building $out from $pkg (the first build compiles the Kubernetes client, OpenTelemetry and the cloud SDKs: several minutes on two cores; later builds are cached)"
# go list fetches missing modules first (it prints "go: downloading ..."),
# so the count below is the whole dependency graph, standard library included.
total=$($GO list -deps "$pkg" | wc -l)

tty=false
[[ -t 2 ]] && tty=true
done_count=0
status=0
# -v names each package as it is compiled (cached ones are not named).
while IFS= read -r line; do
	case $line in
	go:* | *:[0-9]*:* | \#*)
		# a download notice or a compiler diagnostic: pass it through
		$tty && printf '\r\033[K' >&2
		echo "$line" >&2
		continue
		;;
	esac
	done_count=$((done_count + 1))
	if $tty; then
		printf '\rbuild: compiled %d packages (of at most %d): %s\033[K' "$done_count" "$total" "$line" >&2
	elif ((done_count % 100 == 0)); then
		say "compiled $done_count packages (of at most $total), $(($(date +%s) - began)) s"
	fi
done < <($GO build -v -o "$out" "$pkg" 2>&1; echo "exit=$?" >"$statusfile")
$tty && ((done_count > 0)) && printf '\r\033[K' >&2
status=$(sed -n 's/^exit=//p' "$statusfile")
if [[ $status != 0 ]]; then
	say "go build failed (exit $status)"
	exit "$status"
fi
if ((done_count <= 1)); then
	say "built $out from the build cache, $(($(date +%s) - began)) s"
else
	say "built $out: $done_count packages compiled, $(($(date +%s) - began)) s"
fi
