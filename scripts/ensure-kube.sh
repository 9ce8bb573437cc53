#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Copyright The ipam-dev/ipam Authors
# Prints the directory that holds the kube-apiserver and etcd binaries the
# controller tests run (internal/kubetest), building whichever is missing
# from tools/kube, a module of its own (kubernetes and etcd from the Go
# module proxy). The directory is a cache outside the checkout, shared by
# every checkout and kept between runs:
#   ${IPAM_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ipam-tools}/kube-<version>
# A cold build of kube-apiserver takes 15-40 minutes on two cores; once built
# (or with a warm Go build cache) this takes well under a second. Each binary
# is built under a temporary name and renamed, so an interrupted build never
# leaves a broken one behind; a lock keeps two runs from building at once.
# Progress goes to stderr; stdout carries only the directory.
set -euo pipefail
cd "$(dirname "$0")/../tools/kube"
GO=${GO:-go}

version=$(awk '$1 == "k8s.io/kubernetes" { print $2; exit }' go.mod)
[ -n "$version" ] || { echo "ensure-kube: tools/kube/go.mod requires no k8s.io/kubernetes" >&2; exit 1; }
dir="${IPAM_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/ipam-tools}/kube-$version"

# name -> package, in tools/kube.
declare -A pkgs=(
	[etcd]=./etcd
	[kube-apiserver]=k8s.io/kubernetes/cmd/kube-apiserver
)

# kube-apiserver reports its version as `hack/lib/version.sh` would stamp
# it (else "v0.0.0-master"), so clients that read /version see v1.37.2.
major=${version#v}; major=${major%%.*}
minor=${version#v*.}; minor=${minor%%.*}
v=k8s.io/component-base/version
declare -A ldflags=(
	[etcd]=""
	[kube-apiserver]="-X $v.gitVersion=$version -X $v.gitMajor=$major -X $v.gitMinor=$minor -X $v.gitTreeState=clean"
)

# current NAME: the binary is there and, for kube-apiserver, of this version
# (one built before the version was stamped, or for another go.mod, is not).
current() {
	[ -x "$dir/$1" ] || return 1
	[ "$1" != kube-apiserver ] || [ "$("$dir/$1" --version 2>/dev/null)" = "Kubernetes $version" ]
}

missing() {
	local name
	for name in "${!pkgs[@]}"; do
		current "$name" || return 0
	done
	return 1
}

if missing; then
	mkdir -p "$dir"
	if command -v flock >/dev/null; then
		exec 9>"$dir/.lock"
		flock 9 # another run may be building: wait for it, then look again
	fi
	tmp=() build=""
	trap 'rm -f "${tmp[@]}"' EXIT
	# Stopped mid-build: stop the build too (a terminal's Ctrl-C reaches
	# it anyway; a TERM to this script alone would not).
	trap '[ -z "$build" ] || kill "$build" 2>/dev/null; exit 143' INT TERM
	for name in etcd kube-apiserver; do
		current "$name" && continue
		out="$dir/.$name.tmp.$$"
		tmp+=("$out")
		echo "ensure-kube: building $name ($version) into $dir; a cold kube-apiserver build takes 15-40 minutes" >&2
		start=$SECONDS
		GOWORK=off "$GO" build -trimpath -ldflags "${ldflags[$name]}" -o "$out" "${pkgs[$name]}" >&2 &
		build=$!
		wait "$build"
		build=""
		mv -f "$out" "$dir/$name"
		echo "ensure-kube: built $name in $((SECONDS - start))s" >&2
	done
fi
echo "$dir"
