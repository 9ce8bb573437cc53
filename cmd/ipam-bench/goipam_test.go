// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"bytes"
	"strings"
	"testing"
)

// The peer's module pins go-ipam, takes a checkout in its place only when
// one is given, and its source stays out of the project's builds.
func TestGoipamPeerModule(t *testing.T) {
	pinned := goipamGoMod("")
	if !strings.Contains(pinned, "require github.com/metal-stack/go-ipam "+goipamVersion+"\n") || strings.Contains(pinned, "replace") {
		t.Errorf("without a checkout:\n%s", pinned)
	}
	local := goipamGoMod("/src/go-ipam")
	if !strings.Contains(local, "replace github.com/metal-stack/go-ipam => /src/go-ipam\n") {
		t.Errorf("with a checkout:\n%s", local)
	}
	if !bytes.Contains(goipamPeerMain, []byte("\n//go:build goipampeer\n")) {
		t.Error("goipampeer/main.go lacks its build tag: the project's builds would need go-ipam")
	}
}

func TestGoipamVerdict(t *testing.T) {
	for _, c := range []struct {
		ratio float64
		want  string
	}{{0, "no figures"}, {4.99, "under"}, {5, "ok"}, {7.2, "ok"}} {
		r := &goipamReport{Ratio: c.ratio, Clients: 32}
		if got := r.verdict(); got != c.want {
			t.Errorf("ratio %.2f: %s, want %s", c.ratio, got, c.want)
		}
		if !strings.HasSuffix(r.line(), c.want) {
			t.Errorf("ratio %.2f: line %q does not end in %q", c.ratio, r.line(), c.want)
		}
	}
	if got := (&goipamReport{Skipped: "proxy: 403"}).line(); got != "go-ipam: skipped: proxy: 403" {
		t.Errorf("skipped: %q", got)
	}
}
