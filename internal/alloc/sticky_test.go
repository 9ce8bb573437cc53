// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package alloc

import (
	"net/netip"
	"regexp"
	"strings"
	"testing"
	"time"
)

// identityCheck is the CHECK of leases.sticky_identity (migration 00005):
// ValidateIdentity must accept exactly what the database accepts, so a
// valid request never fails on the constraint (a 500) and the database
// never holds what the API would refuse.
var identityCheck = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._:/-]{0,251}[A-Za-z0-9])?$`)

func FuzzValidateIdentity(f *testing.F) {
	for _, s := range []string{"statefulset/ns/web/0", "a", "a-", "-a", "a b", strings.Repeat("x", 253), strings.Repeat("x", 254), "vm:db.1_2", "é"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		err := ValidateIdentity("sticky.identity", id)
		if ok := identityCheck.MatchString(id); ok != (err == nil) {
			t.Fatalf("%q: database accepts %v, ValidateIdentity says %v", id, ok, err)
		}
	})
}

func TestValidateIdentity(t *testing.T) {
	for _, c := range []struct {
		id string
		ok bool
	}{
		{"statefulset/ns/web/0", true},
		{"vm:db-1.example_2", true},
		{"a", true},
		{strings.Repeat("a", 253), true},
		{strings.Repeat("a", 254), false},
		{"", false},
		{"/web/0", false},
		{"web/0/", false},
		{"web 0", false},
		{"web\x00", false},
		{"wéb", false},
		{"web/0?x", false},
	} {
		err := ValidateIdentity("sticky.identity", c.id)
		if (err == nil) != c.ok {
			t.Errorf("%q: %v, want ok=%v", c.id, err, c.ok)
		}
		if err != nil && (!IsKind(err, KindInvalid) || err.(*Error).Field != "sticky.identity") {
			t.Errorf("%q: %v is not an invalid-input of sticky.identity", c.id, err)
		}
	}
}

func TestStickyRequestValidate(t *testing.T) {
	for _, c := range []struct {
		retention time.Duration
		ok        bool
	}{
		{0, true}, // the server's default
		{time.Second, true},
		{MaxStickyRetention, true},
		{MaxStickyRetention + time.Second, false},
		{time.Millisecond, false},
		{-time.Second, false},
	} {
		err := StickyRequest{Identity: "vm/a", Retention: c.retention}.Validate()
		if (err == nil) != c.ok {
			t.Errorf("retention %s: %v, want ok=%v", c.retention, err, c.ok)
		}
	}
}

// ChooseSticky's decisions; what another node holds (its name, block,
// the address, attachment and generation) appears only in the operator's
// detail and reason, while the requesting node's own facts are in both.
//
// A restricted request (a node certificate's, StickyMoves) takes the
// identity from another node only by a binding StickyMoves names, as read
// (node and generation), or one whose retention has ended; else it is
// forbidden, and the detail says why and until when without naming the
// other node's facts. Requests that move nothing (a reuse, require, a
// held identity, another pool of the same node) answer as unrestricted.
func TestChooseSticky(t *testing.T) {
	now := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
	bound := BoundAddress{Addr: netip.MustParseAddr("10.0.3.7"), Block: netip.MustParsePrefix("10.0.3.0/28"),
		Node: "n1", Pool: "default", Attachment: Attachment{ContainerID: "c1", Interface: "eth0"}, Generation: 9,
		RetainedUntil: now.Add(time.Hour)}
	held := bound
	held.Held, held.RetainedUntil = true, time.Time{}
	lapsed := bound
	lapsed.RetainedUntil = now
	noKube := &StickyMoves{Why: "no Kubernetes"}
	allowed := &StickyMoves{From: []BoundLease{{Family: IPv6, Node: "n1", Generation: 9}, {Family: IPv4, Node: "n1", Generation: 9}}}
	changed := &StickyMoves{From: []BoundLease{{Family: IPv4, Node: "n1", Generation: 8}}}
	otherFamily := &StickyMoves{From: []BoundLease{{Family: IPv6, Node: "n1", Generation: 9}}, Why: "still there"}
	const other = "the address bound to it is on another node"
	const opOther = "10.0.3.7 is in block 10.0.3.0/28 of node n1, not of n2"
	const until = "The binding ends at 2030-01-02T04:04:05Z"
	secrets := []string{"n1", "10.0.3", "c1", "eth0", "generation", "9"}
	for _, c := range []struct {
		name        string
		bound       *BoundAddress
		node        string
		pool        string
		require     bool
		moves       *StickyMoves
		reuse       bool
		reason      string // substring
		opReason    string // substring of OperatorReason; "" when none
		errKind     Kind
		errDetail   string // substring
		opErrDetail string // substring of OperatorDetail; "" when none
	}{
		{name: "nothing bound", node: "n1", pool: "default"},
		{name: "nothing bound, required", node: "n1", pool: "default", require: true},
		{name: "same node and pool", bound: &bound, node: "n1", pool: "default", reuse: true},
		{name: "same node and pool, required", bound: &bound, node: "n1", pool: "default", require: true, reuse: true},
		{name: "other node", bound: &bound, node: "n2", pool: "default",
			reason: "the address bound to it is on another node", opReason: "10.0.3.7 is in block 10.0.3.0/28 of node n1, not of n2"},
		{name: "other node, required", bound: &bound, node: "n2", pool: "default", require: true,
			errKind: KindStickyUnavailable, errDetail: "is on another node",
			opErrDetail: "10.0.3.7 is in block 10.0.3.0/28 of node n1, not of n2"},
		{name: "other pool", bound: &bound, node: "n1", pool: "blue",
			reason: `10.0.3.7 is in pool "default", but this request's ipv4 pool is "blue"`},
		{name: "still held", bound: &held, node: "n1", pool: "default",
			errKind: KindLeaseConflict, errDetail: "through attachment c1/eth0 on node n1 (generation 9)"},
		{name: "still held, elsewhere", bound: &held, node: "n2", pool: "default",
			errKind: KindLeaseConflict, errDetail: `identity "statefulset/ns/web/0" is held by a lease on another node; release it first`,
			opErrDetail: "holds 10.0.3.7 through attachment c1/eth0 on node n1 (generation 9)"},

		{name: "restricted, nothing bound", node: "n2", pool: "default", moves: noKube},
		{name: "restricted, same node and pool", bound: &bound, node: "n1", pool: "default", moves: noKube, reuse: true},
		{name: "restricted, same node, other pool", bound: &bound, node: "n1", pool: "blue", moves: noKube,
			reason: `10.0.3.7 is in pool "default", but this request's ipv4 pool is "blue"`},
		{name: "restricted, other node", bound: &bound, node: "n2", pool: "default", moves: noKube,
			errKind: KindForbidden, errDetail: "may not take over: no Kubernetes. " + until},
		{name: "restricted, other node, allowed", bound: &bound, node: "n2", pool: "default", moves: allowed,
			reason: other, opReason: opOther},
		{name: "restricted, other node, binding changed since", bound: &bound, node: "n2", pool: "default", moves: changed,
			errKind: KindForbidden, errDetail: "its binding changed while this request was checked; retry"},
		{name: "restricted, other node, the other family allowed", bound: &bound, node: "n2", pool: "default", moves: otherFamily,
			errKind: KindForbidden, errDetail: "may not take over: still there"},
		{name: "restricted, other node, retention over", bound: &lapsed, node: "n2", pool: "default", moves: noKube,
			reason: other, opReason: opOther},
		{name: "restricted, other node, required", bound: &bound, node: "n2", pool: "default", moves: noKube, require: true,
			errKind: KindStickyUnavailable, errDetail: "is on another node", opErrDetail: opOther},
		{name: "restricted, still held elsewhere", bound: &held, node: "n2", pool: "default", moves: noKube,
			errKind: KindLeaseConflict, errDetail: "is held by a lease on another node",
			opErrDetail: "holds 10.0.3.7 through attachment c1/eth0 on node n1 (generation 9)"},
	} {
		r := StickyRequest{Identity: "statefulset/ns/web/0", Require: c.require, Moves: c.moves}
		got, err := ChooseSticky(r, c.bound, c.node, c.pool, IPv4, now)
		switch {
		case c.errKind != "":
			e, ok := err.(*Error)
			if !ok || e.Kind != c.errKind || !strings.Contains(e.Detail, c.errDetail) || e.Field != "sticky.identity" ||
				!strings.Contains(e.OperatorDetail, c.opErrDetail) || (c.opErrDetail == "") != (e.OperatorDetail == "") {
				t.Errorf("%s: %#v, want %s saying %q (operators %q)", c.name, err, c.errKind, c.errDetail, c.opErrDetail)
				continue
			}
			if c.node != c.bound.Node {
				for _, s := range secrets {
					if strings.Contains(strings.ReplaceAll(e.Detail, "statefulset/ns/web/0", ""), s) {
						t.Errorf("%s: the detail a node sees names %q: %s", c.name, s, e.Detail)
					}
				}
			}
		case err != nil:
			t.Errorf("%s: %v", c.name, err)
		case got.Reuse != c.reuse || !strings.Contains(got.Reason, c.reason) || (c.reason == "") != (got.Reason == "") ||
			!strings.Contains(got.OperatorReason, c.opReason) || (c.opReason == "") != (got.OperatorReason == ""):
			t.Errorf("%s: %+v, want reuse=%v reason %q operator reason %q", c.name, got, c.reuse, c.reason, c.opReason)
		case c.bound != nil && c.node != c.bound.Node:
			for _, s := range secrets {
				if strings.Contains(got.Reason, s) {
					t.Errorf("%s: the reason a node sees names %q: %s", c.name, s, got.Reason)
				}
			}
		}
	}
}
