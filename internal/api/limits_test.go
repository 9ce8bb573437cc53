// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// specLimits walks what clients send (the parameters and request bodies
// of every operation in api/openapi.yaml) and answers each bounded field
// by a key: "path:NAME" or "query:NAME" for a parameter, "Schema.prop"
// for a property, with "[]" for a list's items and "{}" for a map's
// values. A string without maxLength (and without enum), a list without
// maxItems, a map without maxProperties or a number without minimum and
// maximum is reported in missing.
func specLimits(t *testing.T) (limits map[string]string, missing []string) {
	t.Helper()
	data, err := os.ReadFile("../../api/openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := yaml.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	components := doc["components"].(map[string]any)
	resolve := func(ref string) (string, map[string]any) {
		parts := strings.Split(strings.TrimPrefix(ref, "#/components/"), "/")
		return parts[1], components[parts[0]].(map[string]any)[parts[1]].(map[string]any)
	}
	limits = map[string]string{}
	var walk func(key string, s map[string]any, seen []string)
	walk = func(key string, s map[string]any, seen []string) {
		if ref, ok := s["$ref"].(string); ok {
			name, target := resolve(ref)
			if slices.Contains(seen, name) {
				return
			}
			walk(name, target, append(seen, name))
			return
		}
		for _, sub := range asList(s["allOf"]) {
			walk(key, sub.(map[string]any), seen)
		}
		has := func(k string) bool { _, ok := s[k]; return ok }
		switch s["type"] {
		case "string":
			switch {
			case has("enum"):
			case has("maxLength"):
				limits[key] = fmt.Sprint("maxLength ", s["maxLength"])
			default:
				missing = append(missing, key+": a string without maxLength")
			}
		case "integer", "number":
			if has("minimum") && has("maximum") {
				limits[key] = fmt.Sprint("maximum ", s["maximum"])
			} else {
				missing = append(missing, key+": a number without minimum and maximum")
			}
		case "array":
			if has("maxItems") {
				limits[key] = fmt.Sprint("maxItems ", s["maxItems"])
			} else {
				missing = append(missing, key+": a list without maxItems")
			}
			walk(key+"[]", s["items"].(map[string]any), seen)
		case "object", nil:
			if ap, ok := s["additionalProperties"].(map[string]any); ok {
				if has("maxProperties") {
					limits[key] = fmt.Sprint("maxProperties ", s["maxProperties"])
				} else {
					missing = append(missing, key+": a map without maxProperties")
				}
				walk(key+"{}", ap, seen)
			}
			props, _ := s["properties"].(map[string]any)
			for name, p := range props {
				walk(key+"."+name, p.(map[string]any), seen)
			}
		}
	}
	param := func(p map[string]any) {
		if ref, ok := p["$ref"].(string); ok {
			_, p = resolve(ref)
		}
		walk(fmt.Sprintf("%s:%s", p["in"], p["name"]), p["schema"].(map[string]any), nil)
	}
	for _, item := range doc["paths"].(map[string]any) {
		for method, op := range item.(map[string]any) {
			if method == "parameters" {
				for _, p := range asList(op) {
					param(p.(map[string]any))
				}
				continue
			}
			o := op.(map[string]any)
			for _, p := range asList(o["parameters"]) {
				param(p.(map[string]any))
			}
			if rb, ok := o["requestBody"].(map[string]any); ok {
				schema := rb["content"].(map[string]any)["application/json"].(map[string]any)["schema"].(map[string]any)
				walk("body", schema, nil)
			}
		}
	}
	slices.Sort(missing)
	return limits, slices.Compact(missing)
}

func asList(v any) []any {
	l, _ := v.([]any)
	return l
}

// Every string, list, map and number a client sends is bounded in the
// spec, and the handlers refuse one value over each bound with a 400
// naming the field, writing nothing: one request per limit the spec
// declares, and a limit without a request fails the test.
func TestRequestLimits(t *testing.T) {
	limits, missing := specLimits(t)
	for _, m := range missing {
		t.Errorf("api/openapi.yaml: %s", m)
	}
	e := newEnv(t, nil)
	seedBadInput(e)

	long := func(n int) string { return strings.Repeat("a", n) }
	many := func(n int, f func(i int) any) []any {
		out := make([]any, n)
		for i := range out {
			out[i] = f(i)
		}
		return out
	}
	labels := func(n int) map[string]string {
		m := map[string]string{}
		for i := range n {
			m[fmt.Sprintf("k%d", i)] = "v"
		}
		return m
	}
	poolWith := func(kv ...any) map[string]any {
		spec := map[string]any{"ipv4": map[string]any{"cidrs": []string{"10.50.0.0/16"}, "maskSize": 24}}
		for i := 0; i < len(kv); i += 2 {
			spec[kv[i].(string)] = kv[i+1]
		}
		return map[string]any{"name": "limits", "spec": spec}
	}
	cloudWith := func(k string, v any) map[string]any {
		return poolWith("cloud", map[string]any{"provider": "aws", k: v})
	}
	family := func(kv ...any) map[string]any {
		f := map[string]any{"cidrs": []string{"10.50.0.0/16"}, "maskSize": 24}
		for i := 0; i < len(kv); i += 2 {
			f[kv[i].(string)] = kv[i+1]
		}
		return poolWith("ipv4", f)
	}
	cidrPool := func(kv ...any) map[string]any {
		c := map[string]any{"cidr": "10.50.0.0/16"}
		for i := 0; i < len(kv); i += 2 {
			c[kv[i].(string)] = kv[i+1]
		}
		return family("pool", []any{c})
	}
	expr := func(key string, values []any) map[string]any {
		return poolWith("podSelector", map[string]any{"matchExpressions": []any{
			map[string]any{"key": key, "operator": "In", "values": values}}})
	}
	attach := func(cid, iface string) map[string]any { return map[string]any{"containerID": cid, "interface": iface} }
	ranges := func(start, end string) map[string]any {
		return cidrPool("reservedRanges", []any{map[string]any{"start": start, "end": end}})
	}

	lbPool := func(name string, blocks ...any) map[string]any {
		return map[string]any{"name": name, "spec": map[string]any{"blocks": blocks}}
	}

	type limitCase struct {
		method, path string
		body         any
		field        string
	}
	cases := map[string]limitCase{
		"path:space":           {"GET", "/v1/spaces/" + long(64), nil, "space"},
		"query:space":          {"GET", "/v1/pools?space=" + long(64), nil, "space"},
		"query:limit":          {"GET", "/v1/pools?limit=1001", nil, "limit"},
		"query:from":           {"GET", "/v1/history?node=n1&from=" + long(65), nil, "from"},
		"query:to":             {"GET", "/v1/history?node=n1&to=" + long(65), nil, "to"},
		"query:at":             {"GET", "/v1/addresses/10.9.0.9/history?at=" + long(65), nil, "at"},
		"query:owner":          {"GET", "/v1/history?owner=" + long(318), nil, "owner"},
		"query:identity":       {"GET", "/v1/sticky-bindings?identity=" + long(254), nil, "identity"},
		"query:generation":     {"DELETE", "/v1/addresses/10.9.0.9?generation=0", nil, "generation"},
		"query:continue":       {"GET", "/v1/pools?continue=" + long(1025), nil, "continue"},
		"path:pool":            {"GET", "/v1/pools/" + long(64), nil, "pool"},
		"query:window":         {"GET", "/v1/pools/default/capacity?window=" + long(33), nil, "window"},
		"path:node":            {"GET", "/v1/nodes/" + long(254) + "/blocks", nil, "node"},
		"query:cidr":           {"DELETE", "/v1/nodes/n1/blocks?cidr=" + long(65), nil, "cidr"},
		"path:containerID":     {"GET", "/v1/nodes/n1/attachments/" + long(257) + "/eth0", nil, "containerID"},
		"path:interface":       {"GET", "/v1/nodes/n1/attachments/c1/" + long(65), nil, "interface"},
		"query:node":           {"GET", "/v1/leases?node=" + long(254), nil, "node"},
		"query:pool":           {"GET", "/v1/leases?pool=" + long(64), nil, "pool"},
		"query:pool[]":         {"GET", "/v1/nodes/n1/pools?pool=" + long(64), nil, "pool[0]"},
		"query:ownerNamespace": {"GET", "/v1/leases?ownerNamespace=" + long(64), nil, "ownerNamespace"},
		"query:ownerName":      {"GET", "/v1/leases?ownerName=" + long(254), nil, "ownerName"},
		"path:address":         {"GET", "/v1/addresses/" + long(65), nil, "address"},
		"query:maskSize":       {"GET", "/v1/sizing?cidr=10.0.0.0/16&maskSize=129", nil, "maskSize"},
		"path:name":            {"DELETE", "/v1/tokens/" + long(64), nil, "name"},

		"SpaceRequest.name":         {"POST", "/v1/spaces", map[string]any{"name": long(64)}, "name"},
		"LBPoolRequest.name":        {"POST", "/v1/lb-pools", lbPool(long(64), map[string]any{"cidr": "192.168.9.0/24"}), "name"},
		"LBPoolUpdate.name":         {"PUT", "/v1/lb-pools/default", lbPool(long(64), map[string]any{"cidr": "192.168.9.0/24"}), "name"},
		"LBBlock.cidr":              {"POST", "/v1/lb-pools", lbPool("limits", map[string]any{"cidr": long(65)}), "spec.blocks[0].cidr"},
		"LBBlock.start":             {"POST", "/v1/lb-pools", lbPool("limits", map[string]any{"start": long(65)}), "spec.blocks[0].start"},
		"LBBlock.stop":              {"POST", "/v1/lb-pools", lbPool("limits", map[string]any{"start": "192.168.9.1", "stop": long(65)}), "spec.blocks[0].stop"},
		"path:namespace":            {"GET", "/v1/vip-owners/" + long(64) + "/web", nil, "namespace"},
		"VIPRequest.families":       {"PUT", "/v1/vip-owners/ns/web", map[string]any{"families": []string{"ipv4", "ipv6", "ipv4"}}, "families"},
		"VIPRequest.addresses":      {"PUT", "/v1/vip-owners/ns/web", map[string]any{"addresses": many(17, func(i int) any { return fmt.Sprintf("192.168.7.%d", i) })}, "addresses"},
		"VIPRequest.addresses[]":    {"PUT", "/v1/vip-owners/ns/web", map[string]any{"addresses": []any{long(65)}}, "addresses[0]"},
		"VIPSharing.key":            {"PUT", "/v1/vip-owners/ns/web", map[string]any{"sharing": map[string]any{"key": long(254)}}, "sharing.key"},
		"VIPSharing.crossNamespace": {"PUT", "/v1/vip-owners/ns/web", map[string]any{"sharing": map[string]any{"crossNamespace": many(65, func(i int) any { return fmt.Sprint("ns", i) })}}, "sharing.crossNamespace"},
		"VIPSharing.crossNamespace[]": {"PUT", "/v1/vip-owners/ns/web", map[string]any{"sharing": map[string]any{"crossNamespace": []any{long(64)}}},
			"sharing.crossNamespace[0]"},
		"VIPSharing.ports": {"PUT", "/v1/vip-owners/ns/web", map[string]any{"sharing": map[string]any{"ports": many(257, func(i int) any { return map[string]any{"port": i + 1} })}},
			"sharing.ports"},
		"VIPPort.port":                     {"PUT", "/v1/vip-owners/ns/web", map[string]any{"sharing": map[string]any{"ports": []any{map[string]any{"port": 65536}}}}, "sharing.ports[0].port"},
		"path:group":                       {"GET", "/v1/cidr-groups/" + long(64), nil, "group"},
		"CIDRGroupRequest.name":            {"POST", "/v1/cidr-groups", map[string]any{"name": long(64)}, "name"},
		"CIDRGroupUpdate.name":             {"PUT", "/v1/cidr-groups/corp", map[string]any{"name": long(64)}, "name"},
		"CIDRGroupRequest.externalCIDRs":   {"POST", "/v1/cidr-groups", map[string]any{"name": "g", "externalCIDRs": many(1025, func(i int) any { return fmt.Sprintf("10.%d.%d.0/24", i/256, i%256) })}, "externalCIDRs"},
		"CIDRGroupUpdate.externalCIDRs":    {"PUT", "/v1/cidr-groups/corp", map[string]any{"externalCIDRs": many(1025, func(i int) any { return fmt.Sprintf("10.%d.%d.0/24", i/256, i%256) })}, "externalCIDRs"},
		"CIDRGroupRequest.externalCIDRs[]": {"POST", "/v1/cidr-groups", map[string]any{"name": "g", "externalCIDRs": []any{long(65)}}, "externalCIDRs[0]"},
		"CIDRGroupUpdate.externalCIDRs[]":  {"PUT", "/v1/cidr-groups/corp", map[string]any{"externalCIDRs": []any{long(65)}}, "externalCIDRs[0]"},
		"LBPoolSpec.reservedCIDRGroups": {"POST", "/v1/lb-pools", map[string]any{"name": "limits", "spec": map[string]any{
			"blocks": []any{map[string]any{"cidr": "192.168.9.0/24"}}, "reservedCIDRGroups": many(17, func(i int) any { return fmt.Sprint("g", i) })}},
			"spec.reservedCIDRGroups"},
		"LBPoolSpec.reservedCIDRGroups[]": {"POST", "/v1/lb-pools", map[string]any{"name": "limits", "spec": map[string]any{
			"blocks": []any{map[string]any{"cidr": "192.168.9.0/24"}}, "reservedCIDRGroups": []any{long(64)}}}, "spec.reservedCIDRGroups[0]"},
		"LBPoolSpec.blocks": {"POST", "/v1/lb-pools", lbPool("limits", many(257, func(i int) any {
			return map[string]any{"start": fmt.Sprintf("192.168.%d.%d", 100+i/256, i%256)}
		})...), "spec.blocks"},
		"PoolRequest.name": {"POST", "/v1/pools", pool4(long(64), 24, "10.50.0.0/16"), "name"},
		"PoolUpdate.name":  {"PUT", "/v1/pools/default", pool4(long(64), 24, "10.50.0.0/16"), "name"},
		"Labels": {"POST", "/v1/pools", map[string]any{"name": "limits", "labels": labels(129),
			"spec": poolWith()["spec"]}, "labels"},
		"Labels{}": {"PUT", "/v1/nodes/n1", map[string]any{"labels": map[string]string{"k": long(64)}}, "labels[k]"},
		"PoolFamilySpec.cidrs": {"POST", "/v1/pools", family("cidrs", many(33, func(i int) any { return fmt.Sprintf("10.%d.0.0/16", 100+i) })),
			"spec.ipv4.cidrs"},
		"PoolFamilySpec.cidrs[]":  {"POST", "/v1/pools", family("cidrs", []any{long(65)}), "spec.ipv4.cidrs[0]"},
		"PoolFamilySpec.maskSize": {"POST", "/v1/pools", family("maskSize", 129), "spec.ipv4.maskSize"},
		"PoolFamilySpec.pool":     {"POST", "/v1/pools", family("pool", many(33, func(int) any { return map[string]any{"cidr": "10.50.0.0/16"} })), "spec.ipv4.pool"},
		"PoolCIDRConfig.cidr":     {"POST", "/v1/pools", cidrPool("cidr", long(65)), "spec.ipv4.pool[0].cidr"},
		"PoolCIDRConfig.reservedRanges": {"POST", "/v1/pools", cidrPool("reservedRanges", many(33, func(i int) any {
			return map[string]any{"start": fmt.Sprintf("10.50.%d.0", i), "end": fmt.Sprintf("10.50.%d.1", i)}
		})), "spec.ipv4.pool[0].reservedRanges"},
		"AddressRange.start": {"POST", "/v1/pools", ranges(long(65), "10.50.0.1"), "spec.ipv4.pool[0].reservedRanges[0].start"},
		"AddressRange.end":   {"POST", "/v1/pools", ranges("10.50.0.0", long(65)), "spec.ipv4.pool[0].reservedRanges[0].end"},
		"LabelSelector.matchExpressions": {"POST", "/v1/pools", poolWith("podSelector", map[string]any{"matchExpressions": many(33, func(i int) any {
			return map[string]any{"key": fmt.Sprintf("k%d", i), "operator": "Exists"}
		})}), "spec.podSelector.matchExpressions"},
		"LabelSelectorRequirement.key":      {"POST", "/v1/pools", expr(long(318), []any{"v"}), "spec.podSelector"},
		"LabelSelectorRequirement.values":   {"POST", "/v1/pools", expr("k", many(65, func(i int) any { return fmt.Sprint(i) })), "spec.podSelector.matchExpressions[0].values"},
		"LabelSelectorRequirement.values[]": {"POST", "/v1/pools", expr("k", []any{long(64)}), "spec.podSelector"},
		"PoolSpec.preAllocate":              {"POST", "/v1/pools", poolWith("preAllocate", 65537), "spec.preAllocate"},
		"PoolSpec.maxBlocksPerNode":         {"POST", "/v1/pools", poolWith("maxBlocksPerNode", 16777217), "spec.maxBlocksPerNode"},
		"CloudSpec.firstInterfaceIndex":     {"POST", "/v1/pools", cloudWith("firstInterfaceIndex", 32), "spec.cloud.firstInterfaceIndex"},
		"CloudSpec.releaseDelaySeconds":     {"POST", "/v1/pools", cloudWith("releaseDelaySeconds", 86401), "spec.cloud.releaseDelaySeconds"},
		"CloudSpec.subnetIDs": {"POST", "/v1/pools", cloudWith("subnetIDs", many(17, func(i int) any { return fmt.Sprintf("subnet-%08x", i) })),
			"spec.cloud.subnetIDs"},
		"CloudSpec.subnetIDs[]": {"POST", "/v1/pools", cloudWith("subnetIDs", []any{"subnet-" + long(18)}), "spec.cloud.subnetIDs[0]"},
		"CloudSpec.securityGroups": {"POST", "/v1/pools", cloudWith("securityGroups", many(6, func(i int) any { return fmt.Sprintf("sg-%08x", i) })),
			"spec.cloud.securityGroups"},
		"CloudSpec.securityGroups[]":    {"POST", "/v1/pools", cloudWith("securityGroups", []any{"sg-" + long(18)}), "spec.cloud.securityGroups[0]"},
		"CloudSpec.subnetTags":          {"POST", "/v1/pools", cloudWith("subnetTags", labels(17)), "spec.cloud.subnetTags"},
		"CloudSpec.subnetTags{}":        {"POST", "/v1/pools", cloudWith("subnetTags", map[string]string{"k": long(257)}), "spec.cloud.subnetTags"},
		"CloudSpec.securityGroupTags":   {"POST", "/v1/pools", cloudWith("securityGroupTags", labels(17)), "spec.cloud.securityGroupTags"},
		"CloudSpec.securityGroupTags{}": {"POST", "/v1/pools", cloudWith("securityGroupTags", map[string]string{"k": long(257)}), "spec.cloud.securityGroupTags"},
		"CloudWatermarks.preAllocate": {"POST", "/v1/pools", cloudWith("watermarks", map[string]any{"preAllocate": 4097}),
			"spec.cloud.watermarks.preAllocate"},
		"CloudWatermarks.minAllocate": {"POST", "/v1/pools", cloudWith("watermarks", map[string]any{"minAllocate": 4097}),
			"spec.cloud.watermarks.minAllocate"},
		"CloudWatermarks.maxAllocate": {"POST", "/v1/pools", cloudWith("watermarks", map[string]any{"maxAllocate": 4097}),
			"spec.cloud.watermarks.maxAllocate"},
		"CloudWatermarks.maxAboveWatermark": {"POST", "/v1/pools", cloudWith("watermarks", map[string]any{"maxAboveWatermark": 4097}),
			"spec.cloud.watermarks.maxAboveWatermark"},
		"CloudWarmTargets.warmENI": {"POST", "/v1/pools", cloudWith("warmTargets", map[string]any{"warmENI": 4097}),
			"spec.cloud.warmTargets.warmENI"},
		"CloudWarmTargets.warmIP": {"POST", "/v1/pools", cloudWith("warmTargets", map[string]any{"warmIP": 4097}),
			"spec.cloud.warmTargets.warmIP"},
		"CloudWarmTargets.minimumIP": {"POST", "/v1/pools", cloudWith("warmTargets", map[string]any{"minimumIP": 4097}),
			"spec.cloud.warmTargets.minimumIP"},
		"CloudWarmTargets.warmPrefix": {"POST", "/v1/pools", cloudWith("warmTargets", map[string]any{"warmPrefix": 4097}),
			"spec.cloud.warmTargets.warmPrefix"},
		"CloudWarmTargets.maxPods": {"POST", "/v1/pools", cloudWith("warmTargets", map[string]any{"maxPods": 4097}),
			"spec.cloud.warmTargets.maxPods"},
		"NodeAddress.address": {"PUT", "/v1/nodes/n1", map[string]any{"addresses": []any{map[string]any{"type": "InternalIP", "address": long(65)}}},
			"addresses[0].address"},
		"NodeSpec.addresses": {"PUT", "/v1/nodes/n1", map[string]any{"addresses": many(17, func(i int) any {
			return map[string]any{"type": "InternalIP", "address": fmt.Sprintf("192.168.0.%d", i)}
		})}, "addresses"},
		"NodeSpec.providerID": {"PUT", "/v1/nodes/n1", map[string]any{"providerID": long(513)}, "providerID"},
		"NodeSpec.podCIDRs": {"PUT", "/v1/nodes/n1", map[string]any{"podCIDRs": many(17, func(i int) any { return fmt.Sprintf("10.0.%d.0/24", i) })},
			"podCIDRs"},
		"NodeSpec.podCIDRs[]": {"PUT", "/v1/nodes/n1", map[string]any{"podCIDRs": []any{long(65)}}, "podCIDRs[0]"},
		"CarveRequest.pool":   {"POST", "/v1/nodes/n1/blocks", map[string]any{"pool": long(64), "family": "ipv4"}, "pool"},
		"Owner.namespace": {"POST", "/v1/nodes/n1/leases", leaseWith("owner", map[string]any{"namespace": long(64), "name": "p"}),
			"owner.namespace"},
		"Owner.name": {"POST", "/v1/nodes/n1/leases", leaseWith("owner", map[string]any{"namespace": "ns", "name": long(254)}), "owner.name"},
		"Owner.uid": {"POST", "/v1/nodes/n1/leases", leaseWith("owner", map[string]any{"namespace": "ns", "name": "p", "uid": long(129)}),
			"owner.uid"},
		"LeaseRequest.containerID": {"POST", "/v1/nodes/n1/leases", leaseWith("containerID", long(257)), "containerID"},
		"LeaseRequest.interface":   {"POST", "/v1/nodes/n1/leases", leaseWith("interface", long(65)), "interface"},
		"LeaseRequest.pool":        {"POST", "/v1/nodes/n1/leases", leaseWith("pool", long(64)), "pool"},
		"LeaseRequest.families":    {"POST", "/v1/nodes/n1/leases", leaseWith("families", []string{"ipv4", "ipv6", "ipv4"}), "families"},
		"FamilyPools.ipv4":         {"POST", "/v1/nodes/n1/leases", leaseWith("pools", map[string]any{"ipv4": long(64)}), "pools.ipv4"},
		"FamilyPools.ipv6":         {"POST", "/v1/nodes/n1/leases", leaseWith("pools", map[string]any{"ipv6": long(64)}), "pools.ipv6"},
		"Annotations":              {"POST", "/v1/nodes/n1/leases", leaseWith("pod", map[string]any{"annotations": labels(1025)}), "pod.annotations"},
		"Annotations{}": {"POST", "/v1/nodes/n1/leases", leaseWith("namespace", map[string]any{"annotations": map[string]string{"k": long(262145)}}),
			"namespace.annotations"},
		"AttachmentRef.containerID": {"POST", "/v1/nodes/n1/reconcile", map[string]any{"attachments": []any{attach(long(257), "eth0")}},
			"attachments[0].containerID"},
		"AttachmentRef.interface": {"POST", "/v1/nodes/n1/reconcile", map[string]any{"attachments": []any{attach("c1", long(65))}},
			"attachments[0].interface"},
		"ReconcileRequest.attachments": {"POST", "/v1/nodes/n1/reconcile", map[string]any{"attachments": many(4097, func(i int) any {
			return attach(fmt.Sprintf("c%d", i), "eth0")
		})}, "attachments"},
		"ReconcileRequest.network": {"POST", "/v1/nodes/n1/reconcile", map[string]any{"network": long(254), "attachments": []any{}}, "network"},
		"LeaseRequest.network":     {"POST", "/v1/nodes/n1/leases", leaseWith("network", long(254)), "network"},
		"query:network":            {"GET", "/v1/nodes/n1/attachments/c1/eth0?network=" + long(254), nil, "network"},
		"ReserveHandover.containerID": {"POST", "/v1/nodes/n1/leases", leaseWith("fromReserve", map[string]any{"containerID": long(257), "interface": "r", "generation": 1}),
			"fromReserve.containerID"},
		"ReserveHandover.interface": {"POST", "/v1/nodes/n1/leases", leaseWith("fromReserve", map[string]any{"containerID": "r", "interface": long(65), "generation": 1}),
			"fromReserve.interface"},
		"ReserveHandover.generation": {"POST", "/v1/nodes/n1/leases", leaseWith("fromReserve", map[string]any{"containerID": "r", "interface": "r", "generation": 0}),
			"fromReserve.generation"},
		"ReconcileRequest.generation": {"POST", "/v1/nodes/n1/reconcile", map[string]any{"generation": -1, "attachments": []any{}}, "generation"},
		"StickyRequest.identity":      {"POST", "/v1/nodes/n1/leases", leaseWith("sticky", map[string]any{"identity": long(254)}), "sticky.identity"},
		"StickyRequest.retention":     {"POST", "/v1/nodes/n1/leases", leaseWith("sticky", map[string]any{"identity": "web-0", "retention": long(33)}), "sticky.retention"},
		"TokenRequest.name":           {"POST", "/v1/tokens", map[string]any{"name": long(64), "role": "viewer"}, "name"},
		"TokenRequest.expiresIn":      {"POST", "/v1/tokens", map[string]any{"name": "t", "role": "viewer", "expiresIn": long(33)}, "expiresIn"},
		"TokenRequest.expiresAt":      {"POST", "/v1/tokens", map[string]any{"name": "t", "role": "viewer", "expiresAt": long(65)}, "expiresAt"},
	}
	for _, key := range slices.Sorted(maps.Keys(limits)) {
		if _, ok := cases[key]; !ok {
			t.Errorf("the spec bounds %s (%s) but no request here goes over it", key, limits[key])
		}
	}
	before := authSnapshot(e)
	for _, key := range slices.Sorted(maps.Keys(cases)) {
		c := cases[key]
		if _, ok := limits[key]; !ok {
			t.Errorf("case %s: the spec declares no such limit", key)
			continue
		}
		r := e.do(c.method, c.path, c.body)
		p := r.problem(t)
		if r.status != 400 || p.Type != "urn:ipam:problem:invalid-input" || deref(p.Field, "") != c.field {
			t.Errorf("%s (%s): %d field %q, want 400 naming %q: %.300s", key, limits[key], r.status, deref(p.Field, ""), c.field, r.body)
		}
		if len(r.body) > 2048 {
			t.Errorf("%s: a %d-byte answer echoes the input", key, len(r.body))
		}
	}
	if after := authSnapshot(e); !maps.Equal(before, after) {
		t.Error("a refused request changed the database")
	}
}
