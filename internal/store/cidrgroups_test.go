// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// TestCIDRGroups: create (a retry answers the same, another body is a
// conflict), which groups hold an address (the longest CIDR of each),
// update, delete, a missing space, and a space with groups not deleted.
func TestCIDRGroups(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	corp := alloc.CIDRGroup{Space: alloc.DefaultSpace, Name: "corp", Labels: map[string]string{"tier": "internal"},
		CIDRs: prefixes("10.30.0.0/16", "192.168.100.0/24", "10.30.5.0/24", "fd30::/48")}
	got, err := f.s.CreateCIDRGroup(f.ctx, corp)
	if err != nil || len(got.CIDRs) != 4 || got.CIDRs[2].String() != "10.30.5.0/24" || got.Labels["tier"] != "internal" {
		t.Fatalf("create: %+v %v", got, err)
	}
	if again, err := f.s.CreateCIDRGroup(f.ctx, corp); err != nil || !again.CreatedAt.Equal(got.CreatedAt) {
		t.Fatalf("retry: %+v %v", again, err)
	}
	other := corp
	other.CIDRs = prefixes("10.31.0.0/16")
	_, err = f.s.CreateCIDRGroup(f.ctx, other)
	wantKind(t, err, alloc.KindConflict)
	if _, err := f.s.CreateCIDRGroup(f.ctx, alloc.CIDRGroup{Space: alloc.DefaultSpace, Name: "lab", CIDRs: prefixes("10.30.5.128/25")}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.s.CreateCIDRGroup(f.ctx, alloc.CIDRGroup{Space: alloc.DefaultSpace, Name: "empty"}); err != nil {
		t.Fatal(err)
	}
	match := func(a string) string {
		t.Helper()
		ms, err := f.s.CIDRGroupsContaining(f.ctx, alloc.DefaultSpace, netip.MustParseAddr(a))
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, m := range ms {
			out = append(out, m.Group+"="+m.CIDR.String())
		}
		return strings.Join(out, ",")
	}
	for a, want := range map[string]string{
		"10.30.5.200": "corp=10.30.5.0/24,lab=10.30.5.128/25",
		"10.30.9.1":   "corp=10.30.0.0/16",
		"fd30::1":     "corp=fd30::/48",
		"10.99.0.1":   "",
	} {
		if got := match(a); got != want {
			t.Errorf("%s: %q, want %q", a, got, want)
		}
	}
	corp.CIDRs = prefixes("10.40.0.0/16")
	if _, err := f.s.UpdateCIDRGroup(f.ctx, corp); err != nil {
		t.Fatal(err)
	}
	if got := match("10.30.5.200"); got != "lab=10.30.5.128/25" {
		t.Errorf("after the update: %q", got)
	}
	_, err = f.s.UpdateCIDRGroup(f.ctx, alloc.CIDRGroup{Space: alloc.DefaultSpace, Name: "nope"})
	if e := wantKind(t, err, alloc.KindNotFound); e.Field != "group" {
		t.Fatalf("%+v", e)
	}
	_, err = f.s.CreateCIDRGroup(f.ctx, alloc.CIDRGroup{Space: alloc.DefaultSpace, Name: "dup", CIDRs: prefixes("10.0.0.0/8", "10.0.0.0/8")})
	if e := wantKind(t, err, alloc.KindInvalid); e.Field != "externalCIDRs[1]" {
		t.Fatalf("%+v", e)
	}
	_, err = f.s.CreateCIDRGroup(f.ctx, alloc.CIDRGroup{Space: "nope", Name: "x"})
	if e := wantKind(t, err, alloc.KindNotFound); e.Field != "space" {
		t.Fatalf("%+v", e)
	}
	list, next, err := f.s.ListCIDRGroups(f.ctx, alloc.DefaultSpace, alloc.Page{Limit: 2})
	if err != nil || len(list) != 2 || list[0].Name != "corp" || next == "" {
		t.Fatalf("list: %+v %q %v", list, next, err)
	}
	if _, err := f.s.CreateSpace(f.ctx, "b"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.s.CreateCIDRGroup(f.ctx, alloc.CIDRGroup{Space: "b", Name: "corp", CIDRs: prefixes("10.30.0.0/16")}); err != nil {
		t.Fatal(err)
	}
	wantKind(t, f.s.DeleteSpace(f.ctx, "b"), alloc.KindInUse)
	if _, err := f.s.DeleteCIDRGroup(f.ctx, "b", "corp"); err != nil {
		t.Fatal(err)
	}
	if err := f.s.DeleteSpace(f.ctx, "b"); err != nil {
		t.Fatal(err)
	}
}
