// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
)

// seedBadInput gives the bad-input cases something to collide with: a
// dual-stack default pool, a tiny pool that is full, a node holding leases
// of both.
func seedBadInput(e *env) {
	e.t.Helper()
	e.mustDo(201, "POST", "/v1/pools", map[string]any{
		"name": "default",
		"spec": map[string]any{
			"ipv4": map[string]any{"cidrs": []string{"10.0.0.0/16"}, "maskSize": 24},
			"ipv6": map[string]any{"cidrs": []string{"fd00::/104"}, "maskSize": 120},
		},
	}, nil)
	e.mustDo(201, "POST", "/v1/pools", map[string]any{
		"name": "tiny",
		"spec": map[string]any{
			"ipv4":      map[string]any{"cidrs": []string{"10.9.0.0/30"}, "maskSize": 30},
			"nodeLocal": map[string]any{"health": false}, // one leasable address
		},
	}, nil)
	e.mustDo(201, "POST", "/v1/lb-pools", map[string]any{
		"name": "default",
		"spec": map[string]any{"blocks": []map[string]string{{"cidr": "192.168.10.0/24"}, {"start": "fd10::1", "stop": "fd10::ff"}}},
	}, nil)
	e.mustDo(201, "POST", "/v1/cidr-groups", map[string]any{"name": "corp", "externalCIDRs": []string{"10.30.0.0/16"}}, nil)
	e.mustDo(201, "PUT", "/v1/nodes/n1", map[string]any{"labels": map[string]string{"zone": "a"}}, nil)
	e.mustDo(201, "POST", "/v1/nodes/n1/leases", lease("c1", "eth0", "pod1"), nil)
	b := lease("t1", "eth0", "pod-t1")
	b["pool"] = "tiny"
	e.mustDo(201, "POST", "/v1/nodes/n1/leases", b, nil)
}

func lease(containerID, iface, pod string) map[string]any {
	return map[string]any{
		"owner":       map[string]any{"namespace": "ns", "name": pod},
		"containerID": containerID,
		"interface":   iface,
	}
}

func leaseWith(kv ...any) map[string]any {
	b := lease("c9", "eth0", "pod9")
	for i := 0; i < len(kv); i += 2 {
		b[kv[i].(string)] = kv[i+1]
	}
	return b
}

// pool4 is a pool request body with one IPv4 family.
func pool4(name string, mask any, cidrs ...string) map[string]any {
	return map[string]any{"name": name, "spec": map[string]any{"ipv4": map[string]any{"cidrs": cidrs, "maskSize": mask}}}
}

func pool6(name string, mask any, cidrs ...string) map[string]any {
	return map[string]any{"name": name, "spec": map[string]any{"ipv6": map[string]any{"cidrs": cidrs, "maskSize": mask}}}
}

// unsizedReader hides its length, so the client sends the body chunked and
// the server learns its size only by reading.
type unsizedReader struct{ io.Reader }

// TestBadInput sends requests that must be refused, and checks that each
// answer is a problem of the expected type naming the expected field, and
// that the database did not change at all.
func TestBadInput(t *testing.T) {
	e := newEnv(t, nil)
	seedBadInput(e)

	many := make([]string, 33)
	for i := range many {
		many[i] = fmt.Sprintf("10.%d.0.0/16", 100+i)
	}
	big := `{"name":"big","labels":{"x":"` + strings.Repeat("a", 1<<20) + `"}}`

	cases := []struct {
		name        string
		method      string
		path        string
		body        any
		contentType []string // default application/json when there is a body
		status      int
		kind        string
		field       string // "" means the problem must name none
		pool        string
		family      string
	}{
		// Pool CIDRs and masks.
		{name: "malformed CIDR", method: "POST", path: "/v1/pools", body: pool4("p", 24, "10.1.0.0/16", "10.2.0.0/1x"),
			status: 400, kind: "invalid-input", field: "spec.ipv4.cidrs[1]"},
		{name: "non-canonical IPv6 CIDR", method: "POST", path: "/v1/pools", body: pool6("p", 112, "fd00:0::/104"),
			status: 400, kind: "invalid-input", field: "spec.ipv6.cidrs[0]"},
		{name: "host bits set", method: "POST", path: "/v1/pools", body: pool4("p", 16, "10.0.0.1/8"),
			status: 400, kind: "invalid-input", field: "spec.ipv4.cidrs[0]"},
		{name: "mask shorter than the CIDR", method: "POST", path: "/v1/pools", body: pool4("p", 8, "10.1.0.0/16"),
			status: 400, kind: "invalid-input", field: "spec.ipv4.maskSize"},
		{name: "IPv4 mask over 32", method: "POST", path: "/v1/pools", body: pool4("p", 33, "10.1.0.0/16"),
			status: 400, kind: "invalid-input", field: "spec.ipv4.maskSize"},
		{name: "IPv6 mask minus prefix over 16", method: "POST", path: "/v1/pools", body: pool6("p", 96, "fd01::/64"),
			status: 400, kind: "invalid-input", field: "spec.ipv6.maskSize"},
		{name: "IPv4 /32 blocks leave nothing after node-local addresses", method: "POST", path: "/v1/pools", body: pool4("p", 32, "10.1.0.0/16"),
			status: 400, kind: "invalid-input", field: "spec.ipv4.maskSize"},
		{name: "IPv6 CIDR under ipv4", method: "POST", path: "/v1/pools", body: pool4("p", 120, "fd01::/104"),
			status: 400, kind: "invalid-input", field: "spec.ipv4.cidrs[0]"},
		{name: "overlaps another pool", method: "POST", path: "/v1/pools", body: pool4("p", 26, "10.1.0.0/16", "10.0.5.0/24"),
			status: 409, kind: "overlap", field: "spec.ipv4.cidrs[1]"},
		{name: "overlapping CIDRs in one list", method: "POST", path: "/v1/pools", body: pool4("p", 26, "10.2.0.0/16", "10.2.1.0/24"),
			status: 409, kind: "overlap", field: "spec.ipv4.cidrs[1]"},
		{name: "33 CIDRs", method: "POST", path: "/v1/pools", body: pool4("p", 24, many...),
			status: 400, kind: "invalid-input", field: "spec.ipv4.cidrs"},
		{name: "pool without a family", method: "POST", path: "/v1/pools", body: map[string]any{"name": "p", "spec": map[string]any{}},
			status: 400, kind: "invalid-input", field: "spec"},
		{name: "ipv4 without CIDRs", method: "POST", path: "/v1/pools", body: pool4("p", 24),
			status: 400, kind: "invalid-input", field: "spec.ipv4.cidrs"},
		{name: "pool name taken", method: "POST", path: "/v1/pools", body: pool4("default", 24, "10.3.0.0/16"),
			status: 409, kind: "conflict", field: "name"},

		// Special-purpose ranges, overlapped in any way, unless allowed.
		{name: "loopback CIDR", method: "POST", path: "/v1/pools", body: pool4("p", 24, "10.5.0.0/16", "127.0.0.0/16"),
			status: 400, kind: "invalid-input", field: "spec.ipv4.cidrs[1]"},
		{name: "CIDR covering this network", method: "POST", path: "/v1/pools", body: pool4("p", 8, "0.0.0.0/4"),
			status: 400, kind: "invalid-input", field: "spec.ipv4.cidrs[0]"},
		{name: "link-local CIDR", method: "POST", path: "/v1/pools", body: pool4("p", 24, "169.254.0.0/16"),
			status: 400, kind: "invalid-input", field: "spec.ipv4.cidrs[0]"},
		{name: "multicast CIDR", method: "POST", path: "/v1/pools", body: pool4("p", 24, "224.0.0.0/16"),
			status: 400, kind: "invalid-input", field: "spec.ipv4.cidrs[0]"},
		{name: "reserved CIDR with the broadcast address", method: "POST", path: "/v1/pools", body: pool4("p", 24, "255.255.0.0/16"),
			status: 400, kind: "invalid-input", field: "spec.ipv4.cidrs[0]"},
		{name: "IPv6 link-local CIDR", method: "POST", path: "/v1/pools", body: pool6("p", 120, "fe80::/112"),
			status: 400, kind: "invalid-input", field: "spec.ipv6.cidrs[0]"},
		{name: "IPv6 multicast CIDR", method: "POST", path: "/v1/pools", body: pool6("p", 120, "ff02::/112"),
			status: 400, kind: "invalid-input", field: "spec.ipv6.cidrs[0]"},
		{name: "IPv6 loopback", method: "POST", path: "/v1/pools", body: pool6("p", 128, "::1/128"),
			status: 400, kind: "invalid-input", field: "spec.ipv6.cidrs[0]"},
		{name: "IPv6 unspecified", method: "POST", path: "/v1/pools", body: pool6("p", 128, "::/128"),
			status: 400, kind: "invalid-input", field: "spec.ipv6.cidrs[0]"},
		{name: "IPv6 CIDR covering everything", method: "POST", path: "/v1/pools", body: pool6("p", 16, "::/0"),
			status: 400, kind: "invalid-input", field: "spec.ipv6.cidrs[0]"},
		{name: "update adds a loopback CIDR", method: "PUT", path: "/v1/pools/default",
			body:   map[string]any{"spec": map[string]any{"ipv4": map[string]any{"cidrs": []string{"10.0.0.0/16", "127.0.0.0/16"}, "maskSize": 24}}},
			status: 400, kind: "invalid-input", field: "spec.ipv4.cidrs[1]"},
		{name: "loopback VIP block", method: "POST", path: "/v1/lb-pools",
			body:   map[string]any{"name": "x", "spec": map[string]any{"blocks": []map[string]string{{"cidr": "10.40.0.0/24"}, {"cidr": "127.0.0.0/30"}}}},
			status: 400, kind: "invalid-input", field: "spec.blocks[1].cidr"},
		{name: "multicast VIP range", method: "POST", path: "/v1/lb-pools",
			body:   map[string]any{"name": "x", "spec": map[string]any{"blocks": []map[string]string{{"start": "224.0.0.0", "stop": "224.0.0.3"}}}},
			status: 400, kind: "invalid-input", field: "spec.blocks[0].start"},
		{name: "VIP range over loopback", method: "POST", path: "/v1/lb-pools",
			body:   map[string]any{"name": "x", "spec": map[string]any{"blocks": []map[string]string{{"start": "126.255.255.0", "stop": "128.0.0.0"}}}},
			status: 400, kind: "invalid-input", field: "spec.blocks[0]"},
		{name: "IPv6 link-local VIP range end", method: "POST", path: "/v1/lb-pools",
			body:   map[string]any{"name": "x", "spec": map[string]any{"blocks": []map[string]string{{"start": "fe7f:ffff:ffff:ffff:ffff:ffff:ffff:ff00", "stop": "fe80::1"}}}},
			status: 400, kind: "invalid-input", field: "spec.blocks[0].stop"},
		{name: "update adds a loopback VIP block", method: "PUT", path: "/v1/lb-pools/default",
			body:   map[string]any{"spec": map[string]any{"blocks": []map[string]string{{"cidr": "192.168.10.0/24"}, {"cidr": "::1/128"}}}},
			status: 400, kind: "invalid-input", field: "spec.blocks[1].cidr"},
		{name: "CIDR group of the metadata address", method: "POST", path: "/v1/cidr-groups",
			body:   map[string]any{"name": "x", "externalCIDRs": []string{"169.254.169.254/32"}},
			status: 400, kind: "invalid-input", field: "externalCIDRs[0]"},
		{name: "update adds everything to a CIDR group", method: "PUT", path: "/v1/cidr-groups/corp",
			body:   map[string]any{"externalCIDRs": []string{"10.30.0.0/16", "::/0"}},
			status: 400, kind: "invalid-input", field: "externalCIDRs[1]"},
		{name: "maxBlocksPerNode zero", method: "POST", path: "/v1/pools",
			body:   map[string]any{"name": "p", "spec": map[string]any{"ipv4": map[string]any{"cidrs": []string{"10.5.0.0/16"}, "maskSize": 24}, "maxBlocksPerNode": 0}},
			status: 400, kind: "invalid-input", field: "spec.maxBlocksPerNode"},

		// Names and labels.
		{name: "empty pool name", method: "POST", path: "/v1/pools", body: pool4("", 24, "10.1.0.0/16"),
			status: 400, kind: "invalid-input", field: "name"},
		{name: "pool name not a DNS label", method: "POST", path: "/v1/pools", body: pool4("Upper_Case", 24, "10.1.0.0/16"),
			status: 400, kind: "invalid-input", field: "name"},
		{name: "node name not a DNS subdomain", method: "PUT", path: "/v1/nodes/Upper_Case", body: map[string]any{},
			status: 400, kind: "invalid-input", field: "node"},
		{name: "space name not a DNS label", method: "GET", path: "/v1/pools?space=Upper_Case",
			status: 400, kind: "invalid-input", field: "space"},
		{name: "empty space name", method: "POST", path: "/v1/spaces", body: map[string]any{"name": ""},
			status: 400, kind: "invalid-input", field: "name"},
		{name: "bad label key", method: "PUT", path: "/v1/nodes/n2", body: map[string]any{"labels": map[string]string{"bad key!": "v"}},
			status: 400, kind: "invalid-input", field: "labels[bad key!]"},
		{name: "bad node address", method: "PUT", path: "/v1/nodes/n2",
			body:   map[string]any{"addresses": []map[string]string{{"type": "InternalIP", "address": "192.168.0.300"}}},
			status: 400, kind: "invalid-input", field: "addresses[0].address"},
		{name: "bad node address type", method: "PUT", path: "/v1/nodes/n2",
			body:   map[string]any{"addresses": []map[string]string{{"type": "Hostname", "address": "192.168.0.3"}}},
			status: 400, kind: "invalid-input", field: "addresses[0].type"},

		// Unknown objects.
		{name: "unknown pool on allocation", method: "POST", path: "/v1/nodes/n1/leases", body: leaseWith("pool", "nope"),
			status: 404, kind: "not-found", field: "pool"},
		{name: "unknown pool on allocation for an unknown node", method: "POST", path: "/v1/nodes/n7/leases", body: leaseWith("pool", "nope"),
			status: 404, kind: "not-found", field: "pool"},
		{name: "unknown node", method: "GET", path: "/v1/nodes/nope",
			status: 404, kind: "not-found", field: "node"},
		{name: "unknown space", method: "GET", path: "/v1/pools?space=nope",
			status: 404, kind: "not-found", field: "space"},
		{name: "unknown space on get", method: "GET", path: "/v1/spaces/nope",
			status: 404, kind: "not-found", field: "space"},
		{name: "unknown space on node registration", method: "PUT", path: "/v1/nodes/n2?space=nope", body: map[string]any{},
			status: 404, kind: "not-found", field: "space"},
		{name: "unknown pool on carve", method: "POST", path: "/v1/nodes/n1/blocks", body: map[string]any{"pool": "nope", "family": "ipv4"},
			status: 404, kind: "not-found", field: "pool"},
		{name: "unknown attachment", method: "GET", path: "/v1/nodes/n1/attachments/nope/eth0",
			status: 404, kind: "not-found", field: "containerID"},

		// Bodies.
		{name: "body over 1 MiB", method: "POST", path: "/v1/pools", body: big,
			status: 413, kind: "payload-too-large", field: "body"},
		{name: "chunked body over 1 MiB", method: "POST", path: "/v1/pools", body: unsizedReader{strings.NewReader(big)},
			status: 413, kind: "payload-too-large", field: "body"},
		{name: "broken JSON", method: "POST", path: "/v1/pools", body: `{"name": "p", "spec": {`,
			status: 400, kind: "invalid-input", field: "body"},
		{name: "JSON syntax error", method: "POST", path: "/v1/pools", body: `{"name": p}`,
			status: 400, kind: "invalid-input", field: "body"},
		{name: "no body", method: "POST", path: "/v1/pools", body: "",
			status: 400, kind: "invalid-input", field: "body"},
		{name: "array for an object", method: "POST", path: "/v1/pools", body: `[]`,
			status: 400, kind: "invalid-input", field: "body"},
		{name: "maskSize a string", method: "POST", path: "/v1/pools", body: pool4("p", "abc", "10.1.0.0/16"),
			status: 400, kind: "invalid-input", field: "spec.ipv4.maskSize"},
		{name: "owner a number", method: "POST", path: "/v1/nodes/n1/leases", body: leaseWith("owner", 7),
			status: 400, kind: "invalid-input", field: "owner"},
		{name: "text/plain body", method: "POST", path: "/v1/pools", body: `{"name":"p"}`, contentType: []string{"text/plain"},
			status: 415, kind: "unsupported-media-type", field: "Content-Type"},
		{name: "body without a content type", method: "PUT", path: "/v1/nodes/n2", body: `{}`, contentType: []string{""},
			status: 415, kind: "unsupported-media-type", field: "Content-Type"},

		// Leases.
		{name: "containerID with a space", method: "POST", path: "/v1/nodes/n1/leases", body: leaseWith("containerID", "abc def"),
			status: 400, kind: "invalid-input", field: "containerID"},
		{name: "empty interface", method: "POST", path: "/v1/nodes/n1/leases", body: leaseWith("interface", ""),
			status: 400, kind: "invalid-input", field: "interface"},
		{name: "owner namespace not a DNS label", method: "POST", path: "/v1/nodes/n1/leases",
			body:   leaseWith("owner", map[string]any{"namespace": "Kube_System", "name": "p"}),
			status: 400, kind: "invalid-input", field: "owner.namespace"},
		{name: "duplicate family", method: "POST", path: "/v1/nodes/n1/leases", body: leaseWith("families", []string{"ipv4", "ipv4"}),
			status: 400, kind: "invalid-input", field: "families[1]"},
		{name: "unknown family", method: "POST", path: "/v1/nodes/n1/leases", body: leaseWith("families", []string{"ipv5"}),
			status: 400, kind: "invalid-input", field: "families[0]"},
		{name: "family the pool lacks", method: "POST", path: "/v1/nodes/n1/leases", body: leaseWith("pool", "tiny", "families", []string{"ipv6"}),
			status: 400, kind: "invalid-input", field: "families[0]"},
		{name: "empty pool name on allocation", method: "POST", path: "/v1/nodes/n1/leases", body: leaseWith("pool", ""),
			status: 400, kind: "invalid-input", field: "pool"},
		{name: "attachment held by another owner", method: "POST", path: "/v1/nodes/n1/leases", body: lease("c1", "eth0", "intruder"),
			status: 409, kind: "lease-conflict", field: "owner"},
		{name: "pool exhausted", method: "POST", path: "/v1/nodes/n1/leases", body: leaseWith("pool", "tiny"),
			status: 409, kind: "pool-exhausted", field: "pool", pool: "tiny", family: "ipv4"},
		{name: "pool exhausted for a new node", method: "POST", path: "/v1/nodes/n8/leases", body: leaseWith("pool", "tiny"),
			status: 409, kind: "pool-exhausted", field: "pool", pool: "tiny", family: "ipv4"},
		{name: "containerID with a space in the path", method: "GET", path: "/v1/nodes/n1/attachments/abc%20def/eth0",
			status: 400, kind: "invalid-input", field: "containerID"},
		{name: "reconcile without attachments", method: "POST", path: "/v1/nodes/n1/reconcile", body: `{}`,
			status: 400, kind: "invalid-input", field: "attachments"},
		{name: "reconcile with an empty interface", method: "POST", path: "/v1/nodes/n1/reconcile",
			body:   map[string]any{"attachments": []map[string]string{{"containerID": "c1", "interface": ""}}},
			status: 400, kind: "invalid-input", field: "attachments[0].interface"},

		// Lists.
		{name: "limit 0", method: "GET", path: "/v1/pools?limit=0",
			status: 400, kind: "invalid-input", field: "limit"},
		{name: "limit 5000", method: "GET", path: "/v1/leases?limit=5000",
			status: 400, kind: "invalid-input", field: "limit"},
		{name: "limit not a number", method: "GET", path: "/v1/nodes?limit=ten",
			status: 400, kind: "invalid-input", field: "limit"},
		{name: "forged continue token", method: "GET", path: "/v1/nodes?continue=%21%21",
			status: 400, kind: "invalid-input", field: "continue"},
		{name: "bad lease state filter", method: "GET", path: "/v1/leases?state=gone",
			status: 400, kind: "invalid-input", field: "state"},
		{name: "bad node filter", method: "GET", path: "/v1/leases?node=Bad_Node",
			status: 400, kind: "invalid-input", field: "node"},

		// Addresses and blocks.
		{name: "bad address", method: "GET", path: "/v1/addresses/10.0.0.300",
			status: 400, kind: "invalid-input", field: "address"},
		{name: "prefix for an address", method: "DELETE", path: "/v1/addresses/10.0.0.0%2F24",
			status: 400, kind: "invalid-input", field: "address"},
		{name: "block release with a bad cidr", method: "DELETE", path: "/v1/nodes/n1/blocks?cidr=10.0.0.1/24",
			status: 400, kind: "invalid-input", field: "cidr"},
		{name: "block release without cidr", method: "DELETE", path: "/v1/nodes/n1/blocks",
			status: 400, kind: "invalid-input", field: "cidr"},
		{name: "block release of a block in use", method: "DELETE", path: "/v1/nodes/n1/blocks?cidr=10.0.0.0/24",
			status: 409, kind: "in-use", field: "cidr"},
		{name: "carve an unknown family", method: "POST", path: "/v1/nodes/n1/blocks", body: map[string]any{"pool": "default", "family": "ipv5"},
			status: 400, kind: "invalid-input", field: "family"},

		// Updates and deletes.
		{name: "immutable maskSize", method: "PUT", path: "/v1/pools/default",
			body: map[string]any{"spec": map[string]any{
				"ipv4": map[string]any{"cidrs": []string{"10.0.0.0/16"}, "maskSize": 25},
				"ipv6": map[string]any{"cidrs": []string{"fd00::/104"}, "maskSize": 120},
			}},
			status: 409, kind: "immutable-field", field: "spec.ipv4.maskSize"},
		{name: "immutable node-local reservations", method: "PUT", path: "/v1/pools/default",
			body: map[string]any{"spec": map[string]any{
				"ipv4":      map[string]any{"cidrs": []string{"10.0.0.0/16"}, "maskSize": 24},
				"ipv6":      map[string]any{"cidrs": []string{"fd00::/104"}, "maskSize": 120},
				"nodeLocal": map[string]any{"ingress": true},
			}},
			status: 409, kind: "immutable-field", field: "spec.nodeLocal"},
		{name: "removing a CIDR with blocks", method: "PUT", path: "/v1/pools/default",
			body: map[string]any{"spec": map[string]any{
				"ipv4": map[string]any{"cidrs": []string{"10.1.0.0/16"}, "maskSize": 24},
				"ipv6": map[string]any{"cidrs": []string{"fd00::/104"}, "maskSize": 120},
			}},
			status: 409, kind: "in-use", field: "spec.ipv4.cidrs"},
		{name: "update of an unknown pool", method: "PUT", path: "/v1/pools/nope", body: map[string]any{"spec": pool4("", 24, "10.1.0.0/16")["spec"]},
			status: 404, kind: "not-found", field: "pool"},
		{name: "update that renames", method: "PUT", path: "/v1/pools/default", body: pool4("other", 24, "10.0.0.0/16"),
			status: 400, kind: "invalid-input", field: "name"},
		{name: "delete a pool in use", method: "DELETE", path: "/v1/pools/default",
			status: 409, kind: "in-use", field: "pool"},
		{name: "delete a node holding leases", method: "DELETE", path: "/v1/nodes/n1",
			status: 409, kind: "in-use", field: "node"},
		{name: "force not a boolean", method: "DELETE", path: "/v1/nodes/n1?force=maybe",
			status: 400, kind: "invalid-input", field: "force"},
		{name: "delete the default space in use", method: "DELETE", path: "/v1/spaces/default",
			status: 409, kind: "in-use", field: "space"},

		// Sizing.
		{name: "sizing with maskSize 33", method: "GET", path: "/v1/sizing?cidr=10.0.0.0/8&maskSize=33",
			status: 400, kind: "invalid-input", field: "maskSize"},
		{name: "sizing with maskSize abc", method: "GET", path: "/v1/sizing?cidr=10.0.0.0/8&maskSize=abc",
			status: 400, kind: "invalid-input", field: "maskSize"},
		{name: "sizing without cidr", method: "GET", path: "/v1/sizing?maskSize=24",
			status: 400, kind: "invalid-input", field: "cidr"},
		{name: "sizing with host bits", method: "GET", path: "/v1/sizing?cidr=10.0.0.1/8&maskSize=24",
			status: 400, kind: "invalid-input", field: "cidr"},

		// Routing.
		{name: "unknown route", method: "GET", path: "/v2/pools",
			status: 404, kind: "not-found"},
		{name: "unknown route with a body", method: "POST", path: "/v1/nope", body: `x`, contentType: []string{"text/plain"},
			status: 404, kind: "not-found"},
		{name: "wrong method", method: "PATCH", path: "/v1/pools", body: `{}`,
			status: 405, kind: "method-not-allowed"},
	}
	if len(cases) < 30 {
		t.Fatalf("only %d cases", len(cases))
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e.t = t // helpers report on the subtest
			before := e.snapshot()
			res := e.do(c.method, c.path, c.body, c.contentType...)
			if res.status < 400 || res.status > 499 {
				t.Fatalf("status %d, want 4xx: %s", res.status, res.body)
			}
			if res.status != c.status {
				t.Errorf("status %d, want %d: %s", res.status, c.status, res.body)
			}
			p := res.problem(t)
			if want := "urn:ipam:problem:" + c.kind; p.Type != want {
				t.Errorf("type %q, want %q: %s", p.Type, want, res.body)
			}
			if got := deref(p.Field, ""); got != c.field {
				t.Errorf("field %q, want %q: %s", got, c.field, res.body)
			}
			if got := deref(p.Pool, ""); got != c.pool {
				t.Errorf("pool %q, want %q", got, c.pool)
			}
			if got := string(deref(p.Family, "")); got != c.family {
				t.Errorf("family %q, want %q", got, c.family)
			}
			if deref(p.Detail, "") == "" {
				t.Errorf("problem without detail: %s", res.body)
			}
			after := e.snapshot()
			for _, tbl := range tables {
				if before[tbl] != after[tbl] {
					t.Errorf("table %s changed: %s -> %s", tbl, before[tbl], after[tbl])
				}
			}
		})
	}
	e.t = t
}

// TestMethodNotAllowedListsMethods checks the Allow header of a 405.
func TestMethodNotAllowedListsMethods(t *testing.T) {
	e := newEnv(t, nil)
	res := e.do("PATCH", "/v1/pools/default", nil)
	if res.status != http.StatusMethodNotAllowed {
		t.Fatalf("status %d: %s", res.status, res.body)
	}
	res.problem(t)
	if got, want := res.header.Get("Allow"), "GET, PUT, DELETE"; got != want {
		t.Errorf("Allow = %q, want %q", got, want)
	}
}
