// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package alloc

import (
	"strings"
	"testing"
)

// A node certificate leases for a Pod only while Kubernetes has that Pod
// bound to its node, and of the UID the request names, if any; the
// refusal reads the same for every other case.
func TestCheckOwnerPlacement(t *testing.T) {
	web := Owner{Namespace: "authz", Name: "web-0"}
	withUID := Owner{Namespace: "authz", Name: "web-0", UID: "u1"}
	var refusal string
	for _, c := range []struct {
		name  string
		owner Owner
		p     PodPlacement
		ok    bool
	}{
		{"bound here", web, PodPlacement{Exists: true, UID: "u1", Node: "node-a"}, true},
		{"bound here, the UID asked", withUID, PodPlacement{Exists: true, UID: "u1", Node: "node-a"}, true},
		{"bound here, another UID (recreated)", withUID, PodPlacement{Exists: true, UID: "u2", Node: "node-a"}, false},
		{"bound to another node", web, PodPlacement{Exists: true, UID: "u1", Node: "node-b"}, false},
		{"not scheduled", web, PodPlacement{Exists: true, UID: "u1"}, false},
		{"gone", web, PodPlacement{}, false},
	} {
		err := CheckOwnerPlacement(c.owner, "node-a", c.p)
		if c.ok {
			if err != nil {
				t.Errorf("%s: %v", c.name, err)
			}
			continue
		}
		e, ok := err.(*Error)
		if !ok || e.Kind != KindForbidden || e.Field != "owner" || e.OperatorDetail != "" {
			t.Errorf("%s: %#v, want forbidden on owner", c.name, err)
			continue
		}
		d := strings.ReplaceAll(e.Detail, " (uid u1)", "")
		if refusal == "" {
			refusal = d
		} else if d != refusal {
			t.Errorf("%s: detail %q differs from %q: it tells the cases apart", c.name, d, refusal)
		}
		if strings.Contains(d, "node-b") || !strings.Contains(d, `node "node-a"`) || !strings.Contains(d, "authz/web-0") {
			t.Errorf("%s: detail %q", c.name, e.Detail)
		}
	}
	if (PodPlacement{Exists: true}).BoundTo(web, "") {
		t.Error("an unscheduled Pod counts as bound to the empty node name")
	}
}

// Taking an identity from another node: only when the Pod that held it
// has left that node, and then, while it still exists, only by that Pod
// (a StatefulSet Pod moved); once it is gone, by any Pod of the node.
func TestTakeoverRefusal(t *testing.T) {
	web0 := Owner{Namespace: "authz", Name: "web-0", UID: "new"}
	other := Owner{Namespace: "authz", Name: "attacker"}
	last := Owner{Namespace: "authz", Name: "web-0", UID: "old"}
	for _, c := range []struct {
		name      string
		requester Owner
		last      Owner
		now       PodPlacement
		refused   string // substring; "" when allowed
	}{
		{"moved: the same Pod now bound here", web0, last, PodPlacement{Exists: true, UID: "new", Node: "node-a"}, ""},
		{"moved, but the API server places it elsewhere now", web0, last, PodPlacement{Exists: true, UID: "new", Node: "node-c"},
			"not bound to this node"},
		{"moved, but not this UID", web0, last, PodPlacement{Exists: true, UID: "newer", Node: "node-a"}, "not bound to this node"},
		{"still on the node it was bound on", web0, last, PodPlacement{Exists: true, UID: "old", Node: "node-b"},
			"still bound to that node"},
		{"recreated on the node it was bound on", web0, last, PodPlacement{Exists: true, UID: "new", Node: "node-b"},
			"still bound to that node"},
		{"another Pod while it is still on its node", other, last, PodPlacement{Exists: true, UID: "old", Node: "node-b"},
			"still bound to that node"},
		{"another Pod while it is being recreated", other, last, PodPlacement{Exists: true, UID: "new"},
			"only it may take the identity"},
		{"another Pod while it runs on a third node", other, last, PodPlacement{Exists: true, UID: "new", Node: "node-c"},
			"only it may take the identity"},
		{"another Pod once it is gone", other, last, PodPlacement{}, ""},
		{"the same name once it is gone", web0, last, PodPlacement{}, ""},
		{"a lease without an owner", other, Owner{}, PodPlacement{}, "names no Pod"},
		{"a reserve slot's lease", Owner{Namespace: ReserveOwnerNamespace, Name: "net"}, last, PodPlacement{}, "no Pod's"},
		{"from a reserve slot's lease", other, Owner{Namespace: ReserveOwnerNamespace, Name: "net"}, PodPlacement{}, "names no Pod"},
	} {
		got := TakeoverRefusal("node-a", c.requester, c.last, "node-b", c.now)
		if c.refused == "" && got != "" || !strings.Contains(got, c.refused) {
			t.Errorf("%s: %q, want %q", c.name, got, c.refused)
		}
		for _, secret := range []string{"node-b", "node-c", "web-0", "authz"} {
			if strings.Contains(got, secret) {
				t.Errorf("%s: %q names %q", c.name, got, secret)
			}
		}
	}
}
