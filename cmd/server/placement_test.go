// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ipam-dev/ipam/api/ipamv1"
	"github.com/ipam-dev/ipam/internal/kubetest"
	"github.com/ipam-dev/ipam/internal/pgtest"
)

// The server as deployed: mutual TLS and --kubeconfig to a real API
// server. A node certificate leases only for Pods bound to its node, and
// takes a StatefulSet Pod's sticky identity from another node once the Pod
// has moved to it (issue 33): the informers of startKube answer the API's
// lookups.
func TestServeNodeActsOnlyForItsPods(t *testing.T) {
	c := kubetest.Shared(t)
	const ns = "serve-placement"
	c.CreateNamespace(t, ns, nil, nil)
	c.CreatePod(t, ns, "web-0", "node-b", nil, nil)
	c.CreatePod(t, ns, "here", "node-a", nil, nil)

	srv := startMutualTLS(t, pgtest.NewDatabase(t), "--kubeconfig", c.Kubeconfig(t, c.Config()))
	ca, base, client := srv.ca, srv.base, srv.client
	op := client(ca.IssueOperator("platform", "operator", time.Hour))
	nodeA := client(ca.IssueNode("node-a", time.Hour))
	nodeB := client(ca.IssueNode("node-b", time.Hour))
	call := func(c *http.Client, method, path, body string) (int, []byte) {
		t.Helper()
		req, err := http.NewRequest(method, base+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		res, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, b
	}
	const id = "statefulset/" + ns + "/web/0"
	lease := func(cid, pod string) string {
		return `{"owner":{"namespace":"` + ns + `","name":"` + pod + `"},"containerID":"` + cid + `","interface":"eth0",` +
			`"sticky":{"identity":"` + id + `"}}`
	}
	want := func(what string, status int, body []byte, code int, problem string) {
		t.Helper()
		if status != code || (problem != "" && !strings.Contains(string(body), `"type":"urn:ipam:problem:`+problem+`"`)) {
			t.Fatalf("%s: %d %s, want %d %s", what, status, body, code, problem)
		}
	}

	s, b := call(op, "POST", "/v1/pools", `{"name":"default","spec":{"ipv4":{"cidrs":["10.9.0.0/16"],"maskSize":24}}}`)
	want("the operator creates a pool", s, b, 201, "")
	s, b = call(nodeB, "POST", "/v1/nodes/node-b/leases", lease("b1", "web-0"))
	want("node-b leases for web-0", s, b, 201, "")
	s, b = call(nodeB, "DELETE", "/v1/nodes/node-b/attachments/b1/eth0", "")
	want("node-b releases web-0", s, b, 204, "")

	s, b = call(nodeA, "POST", "/v1/nodes/node-a/leases", lease("a1", "web-0"))
	want("node-a for web-0 on node-b", s, b, 403, "forbidden")
	s, b = call(nodeA, "POST", "/v1/nodes/node-a/leases", lease("a1", "here"))
	want("node-a takes web-0's identity for its own Pod", s, b, 403, "forbidden")

	// The StatefulSet's web-0 moves to node-a.
	c.DeletePod(t, ns, "web-0")
	c.CreatePod(t, ns, "web-0", "node-a", nil, nil)
	s, b = call(nodeA, "POST", "/v1/nodes/node-a/leases", lease("a2", "web-0"))
	want("node-a for web-0, moved to it", s, b, 201, "")
	var bound ipamv1.LeaseList
	s, b = call(op, "GET", "/v1/sticky-bindings?identity="+id, "")
	if s != 200 || json.Unmarshal(b, &bound) != nil || len(bound.Items) != 1 || bound.Items[0].Node != "node-a" {
		t.Fatalf("bindings after the move: %d %s", s, b)
	}
}
