// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

// Special-purpose ranges over HTTP for VIP pools and CIDR groups (issue
// 33), as for Pod pools (trust_test.go): refused without
// allowSpecialPurpose on every write, a 400 problem naming the field and
// the range, nothing written; admitted with it.

import (
	"fmt"
	"maps"
	"net/netip"
	"strings"
	"testing"

	"go4.org/netipx"

	"github.com/ipam-dev/ipam/api/ipamv1"
)

// wantSpecialProblem checks r is the 400 of a special-purpose range rng
// on field, which names the opt-in, and that nothing was written.
func wantSpecialProblem(t *testing.T, e *env, what string, before map[string]string, r response, field, rng string) {
	t.Helper()
	p := wantProblem(t, what, r, 400, "invalid-input", field)
	if d := deref(p.Detail, ""); !strings.Contains(d, "special-purpose range "+rng) || !strings.Contains(d, "allowSpecialPurpose") {
		t.Errorf("%s: detail %q, want it to name %s and allowSpecialPurpose", what, d, rng)
	}
	if !maps.Equal(before, e.snapshotAll()) {
		t.Errorf("%s: the refusal wrote", what)
	}
}

// The reproducers: VIP pools of 127.0.0.0/30 and of
// 224.0.0.0-224.0.0.3 gave owners 127.0.0.1 and 224.0.0.0-224.0.0.3.
// Both are refused without the opt-in, by create, dry run and update,
// and accepted with it; a pool then gives from them.
func TestSpecialPurposeLBPoolReproducers(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.mustDo(201, "POST", "/v1/lb-pools", lbBody("plain", blocks(map[string]any{"cidr": "10.0.10.0/24"})), nil)
	for i, c := range []struct {
		block      map[string]any
		field, rng string
		addr       string
	}{
		{map[string]any{"cidr": "127.0.0.0/30"}, "cidr", "127.0.0.0/8", "127.0.0.1"},
		{map[string]any{"start": "224.0.0.0", "stop": "224.0.0.3"}, "start", "224.0.0.0/4", "224.0.0.2"},
	} {
		name := fmt.Sprintf("sp%d", i)
		before := e.snapshotAll()
		body := lbBody(name, blocks(c.block))
		wantSpecialProblem(t, e, name+" create", before, e.do("POST", "/v1/lb-pools", body), "spec.blocks[0]."+c.field, c.rng)
		wantSpecialProblem(t, e, name+" dry run", before, e.do("POST", "/v1/lb-pools?dryRun=true", body), "spec.blocks[0]."+c.field, c.rng)
		// Added to a pool that had none: the block's own index.
		add := map[string]any{"spec": blocks(map[string]any{"cidr": "10.0.10.0/24"}, c.block)}
		wantSpecialProblem(t, e, name+" added by an update", before, e.do("PUT", "/v1/lb-pools/plain", add), "spec.blocks[1]."+c.field, c.rng)
		wantSpecialProblem(t, e, name+" added by a dry-run update", before, e.do("PUT", "/v1/lb-pools/plain?dryRun=true", add), "spec.blocks[1]."+c.field, c.rng)

		body["spec"].(map[string]any)["allowSpecialPurpose"] = true
		var p ipamv1.LBPool
		e.mustDo(201, "POST", "/v1/lb-pools", body, &p)
		if !deref(p.Spec.AllowSpecialPurpose, false) || p.Status.Ipv4 == nil || p.Status.Ipv4.Total != 4 {
			t.Fatalf("%s: %s", name, dump(p))
		}
		// An owner naming an address of it gets it.
		var a ipamv1.VIPAssignment
		e.mustDo(200, "PUT", "/v1/vip-owners/ns/"+name, map[string]any{"addresses": []string{c.addr}}, &a)
		if !a.Satisfied || len(a.Addresses) != 1 || a.Addresses[0].Address != c.addr || a.Addresses[0].Pool != name {
			t.Fatalf("%s: assignment %s", name, dump(a))
		}
		// Its spec written back without the flag is refused; the pool
		// keeps it.
		before = e.snapshotAll()
		wantSpecialProblem(t, e, name+" update without the flag", before,
			e.do("PUT", "/v1/lb-pools/"+name, map[string]any{"spec": blocks(c.block)}), "spec.blocks[0]."+c.field, c.rng)
		e.mustDo(200, "GET", "/v1/lb-pools/"+name, nil, &p)
		if !deref(p.Spec.AllowSpecialPurpose, false) {
			t.Fatalf("%s after a refused update: %s", name, dump(p))
		}
		// A read-modify-write keeps it.
		e.mustDo(200, "PUT", "/v1/lb-pools/"+name, map[string]any{"spec": p.Spec}, &p)
		if !deref(p.Spec.AllowSpecialPurpose, false) {
			t.Fatalf("%s after its own spec written back: %s", name, dump(p))
		}
	}
	// An ordinary pool answers the flag false.
	var p ipamv1.LBPool
	e.mustDo(200, "GET", "/v1/lb-pools/plain", nil, &p)
	if p.Spec.AllowSpecialPurpose == nil || *p.Spec.AllowSpecialPurpose {
		t.Fatalf("plain: %s", dump(p))
	}
}

// A CIDR group holding the cloud metadata address is refused without the
// opt-in, by create, dry run and update; with it, it is created, answers
// the flag and holds the address.
func TestSpecialPurposeCIDRGroups(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.mustDo(201, "POST", "/v1/cidr-groups", map[string]any{"name": "corp", "externalCIDRs": []string{"10.30.0.0/16"}}, nil)
	body := map[string]any{"name": "meta", "externalCIDRs": []string{"10.40.0.0/16", "169.254.169.254/32"}}
	before := e.snapshotAll()
	wantSpecialProblem(t, e, "create", before, e.do("POST", "/v1/cidr-groups", body), "externalCIDRs[1]", "169.254.0.0/16")
	wantSpecialProblem(t, e, "dry run", before, e.do("POST", "/v1/cidr-groups?dryRun=true", body), "externalCIDRs[1]", "169.254.0.0/16")
	put := map[string]any{"externalCIDRs": []string{"10.30.0.0/16", "0.0.0.0/0"}}
	wantSpecialProblem(t, e, "added by an update", before, e.do("PUT", "/v1/cidr-groups/corp", put), "externalCIDRs[1]", "0.0.0.0/8")
	wantSpecialProblem(t, e, "added by a dry-run update", before, e.do("PUT", "/v1/cidr-groups/corp?dryRun=true", put), "externalCIDRs[1]", "0.0.0.0/8")

	body["allowSpecialPurpose"] = true
	var g ipamv1.CIDRGroup
	e.mustDo(201, "POST", "/v1/cidr-groups", body, &g)
	if !g.AllowSpecialPurpose || len(g.ExternalCIDRs) != 2 {
		t.Fatalf("created %s", dump(g))
	}
	var m ipamv1.CIDRGroupMatchList
	e.mustDo(200, "GET", "/v1/addresses/169.254.169.254/cidr-groups", nil, &m)
	if len(m.Items) != 1 || m.Items[0].Group != "meta" {
		t.Fatalf("matches %s", dump(m))
	}
	// A retry must repeat the flag: without it the body is refused.
	delete(body, "allowSpecialPurpose")
	before = e.snapshotAll()
	wantSpecialProblem(t, e, "retry without the flag", before, e.do("POST", "/v1/cidr-groups", body), "externalCIDRs[1]", "169.254.0.0/16")
	wantSpecialProblem(t, e, "update without the flag", before,
		e.do("PUT", "/v1/cidr-groups/meta", map[string]any{"externalCIDRs": g.ExternalCIDRs}), "externalCIDRs[1]", "169.254.0.0/16")
	e.mustDo(200, "PUT", "/v1/cidr-groups/meta", map[string]any{"externalCIDRs": g.ExternalCIDRs, "allowSpecialPurpose": true}, &g)
	if !g.AllowSpecialPurpose {
		t.Fatalf("after a write with the flag %s", dump(g))
	}
	e.mustDo(200, "GET", "/v1/cidr-groups/corp", nil, &g)
	if g.AllowSpecialPurpose || len(g.ExternalCIDRs) != 1 {
		t.Fatalf("corp %s", dump(g))
	}
}

// specialPurposeRanges are the special-purpose ranges, written out apart
// from alloc's list so that one dropped there fails here.
var specialPurposeRanges = []string{
	"0.0.0.0/8", "127.0.0.0/8", "169.254.0.0/16", "224.0.0.0/4", "240.0.0.0/4",
	"::/128", "::1/128", "::ffff:0:0/96", "fe80::/10", "ff00::/8",
}

// No special-purpose range gets into a Pod pool, a VIP pool or a CIDR
// group through any write without the opt-in, whatever shape it comes in
// (the range as a CIDR, an address of it alone, a range over its edge):
// every such request is a 400 problem naming the field, and writes
// nothing. The IPv4-mapped range cannot be written as a CIDR or an
// address at all (the parsers want the IPv4 form); a range passing
// through it can.
func TestSpecialPurposeEveryWrite(t *testing.T) {
	t.Parallel()
	e := newEnv(t, nil)
	e.mustDo(201, "POST", "/v1/pools", map[string]any{"name": "pods", "spec": map[string]any{"ipv4": plFam(24, "10.1.0.0/16"), "ipv6": plFam(120, "fd01::/104")}}, nil)
	e.mustDo(201, "POST", "/v1/lb-pools", lbBody("vips", blocks(map[string]any{"cidr": "10.2.0.0/24"})), nil)
	e.mustDo(201, "POST", "/v1/cidr-groups", map[string]any{"name": "grp", "externalCIDRs": []string{"10.3.0.0/16"}}, nil)
	before := e.snapshotAll()
	n := 0
	for _, s := range specialPurposeRanges {
		p := netip.MustParsePrefix(s)
		first, last := p.Addr(), netipx.PrefixLastIP(p)
		fam, mask := "ipv4", min(p.Bits()+8, 32)
		if p.Addr().Is6() {
			fam, mask = "ipv6", min(p.Bits()+16, 128)
		}
		cidr := p.String()
		if p.Addr().Is4In6() {
			cidr = "" // refused by the parser, not by this rule
		}
		type write struct {
			what, method, path string
			body               any
			field              string
		}
		var writes []write
		if cidr != "" {
			podFam := map[string]any{fam: plFam(mask, cidr)}
			vipBlocks := blocks(map[string]any{"cidr": "10.2.0.0/24"}, map[string]any{"cidr": cidr})
			grp := []string{"10.3.0.0/16", cidr}
			writes = append(writes,
				write{"pool create", "POST", "/v1/pools", map[string]any{"name": "x", "spec": podFam}, "spec." + fam + ".cidrs[0]"},
				write{"pool dry run", "POST", "/v1/pools?dryRun=true", map[string]any{"name": "x", "spec": podFam}, "spec." + fam + ".cidrs[0]"},
				write{"VIP pool create", "POST", "/v1/lb-pools", lbBody("x", vipBlocks), "spec.blocks[1].cidr"},
				write{"VIP pool update", "PUT", "/v1/lb-pools/vips", map[string]any{"spec": vipBlocks}, "spec.blocks[1].cidr"},
				write{"VIP pool dry-run update", "PUT", "/v1/lb-pools/vips?dryRun=true", map[string]any{"spec": vipBlocks}, "spec.blocks[1].cidr"},
				write{"group create", "POST", "/v1/cidr-groups", map[string]any{"name": "x", "externalCIDRs": grp}, "externalCIDRs[1]"},
				write{"group update", "PUT", "/v1/cidr-groups/grp", map[string]any{"externalCIDRs": grp}, "externalCIDRs[1]"},
				write{"group dry-run update", "PUT", "/v1/cidr-groups/grp?dryRun=true", map[string]any{"externalCIDRs": grp}, "externalCIDRs[1]"},
				write{"VIP pool, an address alone", "POST", "/v1/lb-pools", lbBody("x", blocks(map[string]any{"start": last.String()})), "spec.blocks[0].start"},
			)
			if b := first.Prev(); b.IsValid() {
				if _, special := oracleRange(b); !special {
					writes = append(writes, write{"VIP pool, a range over the first edge", "POST", "/v1/lb-pools",
						lbBody("x", blocks(map[string]any{"start": b.String(), "stop": first.String()})), "spec.blocks[0].stop"})
				}
			}
		} else {
			writes = append(writes, write{"VIP pool, a range through the IPv4-mapped addresses", "POST", "/v1/lb-pools",
				lbBody("x", blocks(map[string]any{"start": first.Prev().String(), "stop": last.Next().String()})), "spec.blocks[0]"})
		}
		for _, w := range writes {
			n++
			r := e.do(w.method, w.path, w.body)
			wantSpecialProblem(t, e, s+" "+w.what, before, r, w.field, p.String())
		}
	}
	if n < 80 {
		t.Fatalf("only %d writes tried", n)
	}
}

// oracleRange answers the range of specialPurposeRanges holding a.
func oracleRange(a netip.Addr) (string, bool) {
	for _, s := range specialPurposeRanges {
		if netip.MustParsePrefix(s).Contains(a) {
			return s, true
		}
	}
	return "", false
}
