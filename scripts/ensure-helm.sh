#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Copyright The ipam-dev/ipam Authors
# Prints the directory that holds the helm binary the chart tests run
# (deploy/helm_test.go), building it when missing from tools/helm, a module
# of its own (helm.sh/helm/v4 from the Go module proxy). The directory is a
# cache outside the checkout, shared by every checkout and kept between runs:
#   ${IPAM_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ipam-tools}/helm-<version>
# A cold build takes a few minutes on two cores; once built this takes well
# under a second. The binary is built under a temporary name and renamed, so
# an interrupted build never leaves a broken one behind; a lock keeps two
# runs from building at once. Progress goes to stderr; stdout carries only
# the directory.
set -euo pipefail
cd "$(dirname "$0")/../tools/helm"
GO=${GO:-go}

# (A lone requirement is written on the require line itself.)
version=$(awk '$1 == "helm.sh/helm/v4" { print $2; exit } $1 == "require" && $2 == "helm.sh/helm/v4" { print $3; exit }' go.mod)
[ -n "$version" ] || { echo "ensure-helm: tools/helm/go.mod requires no helm.sh/helm/v4" >&2; exit 1; }
dir="${IPAM_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ipam-tools}/helm-$version"

# helm reports the version stamped at link time (else "v4.3", its
# source's default), so `helm version` names the module's release.
ldflags="-X helm.sh/helm/v4/internal/version.version=$version -X helm.sh/helm/v4/internal/version.gitTreeState=clean"

# current: the binary is there and of this version (one built for another
# go.mod, or without the stamp, is not).
current() {
	[ -x "$dir/helm" ] && [ "$("$dir/helm" version --template '{{.Version}}' 2>/dev/null)" = "$version" ]
}

if ! current; then
	mkdir -p "$dir"
	if command -v flock >/dev/null; then
		exec 9>"$dir/.lock"
		flock 9 # another run may be building: wait for it, then look again
	fi
	if ! current; then
		out="$dir/.helm.tmp.$$" build=""
		trap 'rm -f "$out"' EXIT
		# Stopped mid-build: stop the build too (a terminal's Ctrl-C reaches
		# it anyway; a TERM to this script alone would not).
		trap '[ -z "$build" ] || kill "$build" 2>/dev/null; exit 143' INT TERM
		echo "ensure-helm: building helm ($version) into $dir; a cold build takes a few minutes" >&2
		start=$SECONDS
		CGO_ENABLED=0 GOWORK=off "$GO" build -trimpath -ldflags "$ldflags" -o "$out" helm.sh/helm/v4/cmd/helm >&2 &
		build=$!
		wait "$build"
		build=""
		mv -f "$out" "$dir/helm"
		echo "ensure-helm: built helm in $((SECONDS - start))s" >&2
	fi
fi
echo "$dir"
