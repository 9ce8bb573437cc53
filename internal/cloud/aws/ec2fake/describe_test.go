// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package ec2fake

import "testing"

// TestWildcard: filter values match as EC2 documents them: * any run, ?
// one character, a backslash escapes.
func TestWildcard(t *testing.T) {
	cases := []struct {
		pattern, s string
		want       bool
	}{
		{"prod-1", "prod-1", true},
		{"prod-1", "prod-10", false},
		{"prod-?", "prod-1", true},
		{"prod-?", "prod-?", true},
		{"prod-?", "prod-", false},
		{"prod-?", "prod-12", false},
		{"prod-*", "prod-", true},
		{"prod-*", "prod-anything-at-all", true},
		{"prod-*", "staging-1", false},
		{"*-1", "prod-1", true},
		{"a*b*c", "axxbyyc", true},
		{"a*b*c", "axxbyy", false},
		{`prod-\?`, "prod-?", true},
		{`prod-\?`, "prod-1", false},
		{`prod-\*`, "prod-*", true},
		{`prod-\*`, "prod-12", false},
		{`a\\b`, `a\b`, true},
		{"", "", true},
		{"*", "", true},
		{"?", "", false},
	}
	for _, c := range cases {
		if got := wildcard(c.pattern, c.s); got != c.want {
			t.Errorf("wildcard(%q, %q) = %v, want %v", c.pattern, c.s, got, c.want)
		}
	}
}
