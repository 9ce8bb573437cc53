// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package alloc

import (
	"encoding/json"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"unicode/utf8"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
)

// The fuzz targets below cover every parser and validator of user input in
// the domain. Each also runs its seeds (f.Add and testdata/fuzz/FuzzX) as an
// ordinary test under go test; `make fuzz` explores further for a while.

// invalidField checks that err is the domain's invalid-input error naming a
// field that starts with prefix, as the API's problem answers require.
func invalidField(t *testing.T, err error, prefix string) {
	t.Helper()
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("error %v (%T) is not an *alloc.Error", err, err)
	}
	if e.Kind != KindInvalid || !strings.HasPrefix(e.Field, prefix) || e.Detail == "" {
		t.Fatalf("error %+v: want kind %s naming a field under %q, with a detail", e, KindInvalid, prefix)
	}
}

// FuzzPoolFamilyReserved builds a one-family pool spec from a CIDR, a mask
// and one reserved range, all as a user writes them. Properties: no panic;
// a refusal names a field of the family; an accepted spec has its range
// inside its CIDR, start before end, and blocks of the mask fit the CIDR.
func FuzzPoolFamilyReserved(f *testing.F) {
	f.Add("10.0.0.0/16", 24, "10.0.0.0/16", "10.0.1.0", "10.0.1.255")
	f.Add("10.0.0.0/16", 24, "10.0.0.0/16", "10.0.2.0", "10.0.1.0")
	f.Add("10.0.0.0/16", 24, "10.1.0.0/16", "10.1.0.1", "10.1.0.2")
	f.Add("fd00::/104", 120, "fd00::/104", "fd00::10", "fd00::ff")
	f.Add("fd00::/104", 120, "fd00::/104", "10.0.0.1", "fd00::ff")
	f.Add("10.0.0.0/8", 32, "10.0.0.0/8", "10.255.255.255", "10.255.255.255")
	f.Add("fd00::/64", 96, "fd00::/64", "fd00::", "fd00::")
	f.Add("10.0.0.0/16", -1, "", "", "")
	f.Fuzz(func(t *testing.T, cidr string, mask int, resCIDR, start, end string) {
		var spec PoolSpec
		fam := IPv4
		field := "spec.ipv4"
		pf := &PoolFamily{MaskSize: mask}
		if p, err := ParseCanonicalPrefix(cidr); err == nil {
			pf.CIDRs = []netip.Prefix{p}
			if p.Addr().Is6() {
				fam, field = IPv6, "spec.ipv6"
			}
		}
		// As the API does, a range that does not parse never reaches the
		// domain; here it becomes the zero Addr, which Validate must refuse.
		rc, _ := ParseCanonicalPrefix(resCIDR)
		s, _ := ParseAddr(start)
		e, _ := ParseAddr(end)
		pf.Reserved = []CIDRReservation{{CIDR: rc, Ranges: []AddrRange{{Start: s, End: e}}}}
		if fam == IPv4 {
			spec.IPv4 = pf
		} else {
			spec.IPv6 = pf
		}
		spec.NodeLocal = DefaultNodeLocal
		err := spec.Validate()
		if err != nil {
			invalidField(t, err, field)
			return
		}
		p := pf.CIDRs[0]
		if !p.Contains(s) || !p.Contains(e) || e.Less(s) || FamilyOf(s) != fam {
			t.Fatalf("accepted range %v-%v of %v", s, e, p)
		}
		if mask < p.Bits() || mask > p.Addr().BitLen() {
			t.Fatalf("accepted mask /%d for %v", mask, p)
		}
	})
}

// FuzzLabelSelector decodes a selector as the API does (its JSON form is
// Kubernetes') and converts it. Properties: no panic; a refusal names the
// field; an accepted selector prints as text that parses back to the same
// selector, so what is stored is what matches.
func FuzzLabelSelector(f *testing.F) {
	for _, s := range []string{
		`{}`,
		`{"matchLabels":{"app":"web"}}`,
		`{"matchLabels":{"bad key!":"v"}}`,
		`{"matchLabels":{"app":"-bad-"}}`,
		`{"matchExpressions":[{"key":"tier","operator":"In","values":["a","b"]}]}`,
		`{"matchExpressions":[{"key":"tier","operator":"NotIn","values":[]}]}`,
		`{"matchExpressions":[{"key":"tier","operator":"Exists","values":["x"]}]}`,
		`{"matchExpressions":[{"key":"tier","operator":"DoesNotExist"}]}`,
		`{"matchExpressions":[{"key":"tier","operator":"Gt","values":["1"]}]}`,
		`{"matchExpressions":[{"key":"example.com/tier","operator":"Equals","values":["1"]}]}`,
		`{"matchLabels":{"io.kubernetes.pod.namespace":"shop"},"matchExpressions":[{"key":"a","operator":"In","values":["b"]}]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var ls metav1.LabelSelector
		if json.Unmarshal(b, &ls) != nil {
			return // the JSON decoder refuses it before any selector code runs
		}
		sel, err := LabelSelector("spec.podSelector", &ls)
		if err != nil {
			invalidField(t, err, "spec.podSelector")
			return
		}
		text := sel.String()
		again, err := labels.Parse(text)
		if err != nil {
			t.Fatalf("selector %s prints as %q, which does not parse: %v", b, text, err)
		}
		if again.String() != text {
			t.Fatalf("selector %s: %q parses back as %q", b, text, again.String())
		}
		// Matching must not panic on labels the selector names.
		set := labels.Set{}
		for k, v := range ls.MatchLabels {
			set[k] = v
		}
		if len(ls.MatchExpressions) == 0 && !sel.Matches(set) {
			t.Fatalf("selector %s does not match its own matchLabels %v", b, set)
		}
	})
}

// FuzzNames runs every name and label validator on the same input.
// Properties: no panic; every refusal is invalid-input naming the field it
// was given; an accepted DNS label or subdomain obeys its length and
// character rules; an accepted attachment token is printable ASCII without
// '/'.
func FuzzNames(f *testing.F) {
	for _, s := range []string{
		"default", "n1", "worker-1.example.com", "Upper_Case", "-lead", "trail-", "a..b", "",
		strings.Repeat("a", 63), strings.Repeat("a", 64), strings.Repeat("a.", 127), "eth0", "3f2a9c71",
		"a b", "a/b", "ü", "\x00", "example.com/key", "example.com/", "/key", "a\tb",
	} {
		f.Add(s, "v")
	}
	f.Add("app", "")
	f.Add("app", strings.Repeat("v", 64))
	f.Add("app", "-bad")
	f.Fuzz(func(t *testing.T, name, value string) {
		if err := ValidateLabelName("name", name); err != nil {
			invalidField(t, err, "name")
		} else if len(name) == 0 || len(name) > 63 || !isDNSLabel(name) {
			t.Fatalf("ValidateLabelName accepted %q", name)
		}
		if err := ValidateNodeName("node", name); err != nil {
			invalidField(t, err, "node")
		} else if len(name) == 0 || len(name) > 253 {
			t.Fatalf("ValidateNodeName accepted %q", name)
		} else {
			// Kubernetes bounds only the whole name (253), not each label.
			for label := range strings.SplitSeq(name, ".") {
				if !isDNSLabelShape(label) {
					t.Fatalf("ValidateNodeName accepted %q with label %q", name, label)
				}
			}
		}
		if err := ValidateLabels("labels", map[string]string{name: value}); err != nil {
			invalidField(t, err, "labels[")
		} else if len(value) > 63 || !utf8.ValidString(name) || !utf8.ValidString(value) {
			t.Fatalf("ValidateLabels accepted %q: %q", name, value)
		}
		if err := ValidateAnnotations("pod.annotations", map[string]string{name: value}); err != nil {
			invalidField(t, err, "pod.annotations")
		} else if name == "" || strings.ContainsAny(name, " \t\n") {
			t.Fatalf("ValidateAnnotations accepted key %q", name)
		}
		a := Attachment{ContainerID: name, Interface: value}
		if err := ValidateAttachment("attachments[0].", a); err != nil {
			invalidField(t, err, "attachments[0].")
		} else {
			for _, s := range []string{name, value} {
				if s == "" || strings.ContainsFunc(s, func(r rune) bool { return r <= ' ' || r > '~' || r == '/' }) {
					t.Fatalf("ValidateAttachment accepted %q/%q", name, value)
				}
			}
		}
		if _, err := ParseFamily(name); err == nil && name != "ipv4" && name != "ipv6" {
			t.Fatalf("ParseFamily accepted %q", name)
		}
		if st, err := ParseLeaseState(name); err == nil && string(st) != name {
			t.Fatalf("ParseLeaseState(%q) = %q", name, st)
		}
	})
}

// isDNSLabel is RFC 1123's label, written out independently of the
// validation library: lower-case alphanumerics and '-', alphanumeric at
// both ends, 1 to 63 characters.
func isDNSLabel(s string) bool {
	return len(s) <= 63 && isDNSLabelShape(s)
}

// isDNSLabelShape is isDNSLabel without the bound on the length, which a
// label of a Kubernetes node name does not have.
func isDNSLabelShape(s string) bool {
	if len(s) == 0 || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}
