// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// A connection made in the node namespace to the forwarder's address
// reaches a server on the host's loopback, both ways, and the far end's
// close is seen; once closed, the forwarder accepts no more.
func TestForwardInto(t *testing.T) {
	n, _ := testNode(t)
	if out, err := exec.Command("ip", "-n", n.name, "link", "set", "lo", "up").CombinedOutput(); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	host, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	go func() {
		for {
			c, err := host.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				line, _ := bufio.NewReader(c).ReadString('\n')
				fmt.Fprintf(c, "host saw %s", line)
			}()
		}
	}()
	f, err := forwardInto(n, host.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		var answer string
		if err := n.do(func() error {
			c, err := net.Dial("tcp", f.addr())
			if err != nil {
				return err
			}
			defer c.Close()
			fmt.Fprintf(c, "ping %d\n", i)
			b := new(strings.Builder)
			_, err = bufio.NewReader(c).WriteTo(b) // until the host closes
			answer = b.String()
			return err
		}); err != nil {
			t.Fatal(err)
		}
		if want := fmt.Sprintf("host saw ping %d\n", i); answer != want {
			t.Fatalf("answer %q, want %q", answer, want)
		}
	}
	f.close()
	if err := n.do(func() error {
		c, err := net.Dial("tcp", f.addr())
		if err == nil {
			c.Close()
			return fmt.Errorf("%s still accepts after close", f.addr())
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
}

// readCRDs takes CustomResourceDefinition manifests and refuses other
// objects and unknown fields.
func TestReadCRDs(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("good.yaml", `apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: ippools.whereabouts.cni.cncf.io
spec:
  group: whereabouts.cni.cncf.io
  names: {kind: IPPool, plural: ippools}
  scope: Namespaced
`)
	write("other.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n")
	write("typo.yaml", "apiVersion: apiextensions.k8s.io/v1\nkind: CustomResourceDefinition\nmetadata:\n  name: x\nspek: {}\n")
	crds, err := readCRDs(dir, []string{"good.yaml"})
	if err != nil || len(crds) != 1 || crds[0].Name != "ippools.whereabouts.cni.cncf.io" || crds[0].Spec.Names.Plural != "ippools" {
		t.Fatalf("good.yaml: %v, %v", crds, err)
	}
	for _, bad := range []string{"other.yaml", "typo.yaml", "missing.yaml"} {
		if _, err := readCRDs(dir, []string{"good.yaml", bad}); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
}
