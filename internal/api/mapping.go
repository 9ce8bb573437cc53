// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

// Every conversion between the wire types of package ipamv1 and the domain
// types of package alloc lives in the mapping files: this one holds what
// every resource shares (parameters, labels, optional values), and
// mapping_<resource>.go each resource's own. Parsers (…FromAPI, parse…) run
// once at the edge and return *alloc.Error of KindInvalid naming the request
// field at fault, as a JSON path of the body or a parameter name; formatters
// (…ToAPI) never fail. Converters call only each other, this file's
// helpers, the limits (limits.go) and package alloc: never a handler.

import (
	"net/netip"
	"time"

	"github.com/ipam-dev/ipam/api/ipamv1"
	"github.com/ipam-dev/ipam/internal/alloc"
)

// ---- parameters ----

// parseSpace answers the space query parameter: alloc.DefaultSpace when the
// parameter is absent, otherwise a DNS label (an explicit empty value is an
// error, not the default).
func parseSpace(p *string) (string, error) {
	if p == nil {
		return alloc.DefaultSpace, nil
	}
	if err := alloc.ValidateLabelName("space", *p); err != nil {
		return "", err
	}
	return *p, nil
}

// parsePage answers the page of a list. An absent limit is the default
// (100); a present one must lie in 1..1000, so limit=0 is refused rather
// than read as the default.
// parseSpacePage parses the space and paging parameters of a list.
func parseSpacePage(space *string, limit *int, cont *string) (string, alloc.Page, error) {
	sp, err := parseSpace(space)
	if err != nil {
		return "", alloc.Page{}, err
	}
	page, err := parsePage(limit, cont)
	return sp, page, err
}

// parseSpaceAddr parses the space parameter and the address of a path.
func parseSpaceAddr(space *string, addr string) (string, netip.Addr, error) {
	sp, err := parseSpace(space)
	if err != nil {
		return "", netip.Addr{}, err
	}
	a, err := parseAddr("address", addr)
	return sp, a, err
}

func parsePage(limit *int, cont *string) (alloc.Page, error) {
	var p alloc.Page
	if limit != nil {
		if *limit == 0 {
			return alloc.Page{}, alloc.Invalid("limit", "must be between 1 and 1000")
		}
		p.Limit = *limit
	}
	if cont != nil {
		if err := checkLen("continue", *cont, maxContinueLen); err != nil {
			return alloc.Page{}, err
		}
		p.Continue = *cont
	}
	if err := p.Validate(); err != nil {
		return alloc.Page{}, err
	}
	return p, nil
}

func parseFamily(field string, f ipamv1.Family) (alloc.Family, error) {
	fam, err := alloc.ParseFamily(string(f))
	if err != nil {
		return 0, alloc.Invalid(field, "%s", err)
	}
	return fam, nil
}

func parsePrefix(field, s string) (netip.Prefix, error) {
	if err := checkLen(field, s, maxAddressTextLen); err != nil {
		return netip.Prefix{}, err
	}
	p, err := alloc.ParseCanonicalPrefix(s)
	if err != nil {
		return netip.Prefix{}, alloc.Invalid(field, "%s", err)
	}
	return p, nil
}

func parseAddr(field, s string) (netip.Addr, error) {
	if err := checkLen(field, s, maxAddressTextLen); err != nil {
		return netip.Addr{}, err
	}
	a, err := alloc.ParseAddr(s)
	if err != nil {
		return netip.Addr{}, alloc.Invalid(field, "%s", err)
	}
	return a, nil
}

// ---- labels and times ----

// labelsFromAPI validates labels; absent labels are an empty set.
func labelsFromAPI(field string, l *ipamv1.Labels) (map[string]string, error) {
	if l == nil || *l == nil {
		return map[string]string{}, nil
	}
	if err := alloc.ValidateLabels(field, *l); err != nil {
		return nil, err
	}
	return *l, nil
}

// labelsToAPI never answers null: a resource without labels has {}.
func labelsToAPI(l map[string]string) ipamv1.Labels {
	if l == nil {
		return ipamv1.Labels{}
	}
	return l
}

// optTime answers nil for the zero time, so optional times are omitted.
func optTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	u := t.UTC()
	return &u
}

func optString(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func optInt(n int) *int {
	if n == 0 {
		return nil
	}
	return &n
}

func optAddr(a netip.Addr) *string {
	if !a.IsValid() {
		return nil
	}
	s := a.String()
	return &s
}

func familyToAPI(f alloc.Family) ipamv1.Family { return ipamv1.Family(f.String()) }

// ptr answers a pointer to a copy of v, for optional fields.
func ptr[T any](v T) *T { return &v }

// problemFamily is the family a problem names, nil for none.
func problemFamily(f alloc.Family) *ipamv1.Family {
	if f != alloc.IPv4 && f != alloc.IPv6 {
		return nil
	}
	af := familyToAPI(f)
	return &af
}

// deref answers *p, or def when p is nil.
func deref[T any](p *T, def T) T {
	if p == nil {
		return def
	}
	return *p
}

// mapAll converts every item with f.
func mapAll[T, U any](items []T, f func(T) U) []U {
	out := make([]U, len(items))
	for i, x := range items {
		out[i] = f(x)
	}
	return out
}
