// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/ipam-dev/ipam/api/ipamv1"
	"github.com/ipam-dev/ipam/internal/alloc"
)

// FuzzPoolSpec feeds arbitrary pool bodies through the edge parsing and
// validation: they never panic, every refusal is an invalid-input or
// overlap error naming a field under spec, and an accepted spec formats
// back to the CIDRs it was given.
func FuzzPoolSpec(f *testing.F) {
	for _, s := range []string{
		`{"ipv4":{"cidrs":["10.0.0.0/16"],"maskSize":24}}`,
		`{"ipv6":{"cidrs":["fd00::/104"],"maskSize":120},"nodeLocal":{"router":false}}`,
		`{"ipv4":{"cidrs":["10.0.0.0/8","10.1.0.0/16"],"maskSize":32},"allowFirstIP":true}`,
		`{"ipv6":{"cidrs":["::/0"],"maskSize":128}}`,
		`{"ipv4":{"cidrs":["0.0.0.0/0"],"maskSize":-1}}`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, body string) {
		var in ipamv1.PoolSpec
		if json.Unmarshal([]byte(body), &in) != nil {
			return
		}
		spec, err := poolSpecFromAPI(in)
		if err == nil {
			err = spec.Validate()
		}
		if err != nil {
			var ae *alloc.Error
			if !errors.As(err, &ae) || (ae.Kind != alloc.KindInvalid && ae.Kind != alloc.KindOverlap) || ae.Field == "" {
				t.Fatalf("%s: unexpected error %#v", body, err)
			}
			return
		}
		out := poolSpecToAPI(spec)
		for _, pair := range [][2]*ipamv1.PoolFamilySpec{{in.Ipv4, out.Ipv4}, {in.Ipv6, out.Ipv6}} {
			if (pair[0] == nil) != (pair[1] == nil) {
				t.Fatalf("%s: family lost or invented", body)
			}
			if pair[0] == nil {
				continue
			}
			if dump(pair[0]) != dump(pair[1]) {
				t.Fatalf("%s: formatted back as %s", dump(pair[0]), dump(pair[1]))
			}
		}
	})
}

// FuzzSizing: any cidr and mask either sizes or is refused naming cidr or
// maskSize; nothing panics.
func FuzzSizing(f *testing.F) {
	f.Add("10.0.0.0/8", 24, false, true)
	f.Add("fd00::/104", 120, true, false)
	f.Add("::/0", 64, false, false)
	f.Add("10.0.0.0/8", 33, false, false)
	f.Fuzz(func(t *testing.T, cidr string, mask int, first, ingress bool) {
		s, err := sizingFromAPI(ipamv1.GetSizingParams{Cidr: cidr, MaskSize: mask, AllowFirstIP: &first, Ingress: &ingress})
		if err != nil {
			var ae *alloc.Error
			if !errors.As(err, &ae) || ae.Kind != alloc.KindInvalid || (ae.Field != "cidr" && ae.Field != "maskSize") {
				t.Fatalf("%s /%d: unexpected error %#v", cidr, mask, err)
			}
			return
		}
		out := sizingToAPI(s)
		if out.Cidr != cidr || out.UsablePerNode < 1 || out.UsablePerNode+out.ReservedPerNode != out.AddressesPerNode || out.Nodes < 1 {
			t.Fatalf("%s /%d: %+v", cidr, mask, out)
		}
	})
}

func TestBodyErrorKeepsUnknownErrorsInternal(t *testing.T) {
	err := errors.New("connection reset by peer")
	if got := bodyError(err); got != err {
		t.Errorf("bodyError(%v) = %v", err, got)
	}
	if _, ok := problemOf(&alloc.Error{Kind: "made-up", Detail: "x"}); ok {
		t.Error("an unknown kind reached the client")
	}
}
