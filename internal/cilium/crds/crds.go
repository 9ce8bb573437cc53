// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

// Package crds holds Cilium's CustomResourceDefinitions, from its Go module,
// apart from the operator so that the test harness can install them
// without importing the operator.
package crds

import (
	"fmt"
	"io/fs"

	crdsv2 "github.com/cilium/cilium/pkg/k8s/apis/cilium.io/client/crds/v2"
	crdsv2alpha1 "github.com/cilium/cilium/pkg/k8s/apis/cilium.io/client/crds/v2alpha1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"
)

// crdFiles are the CustomResourceDefinitions the operator reads and writes,
// as Cilium's module embeds them: CiliumNode (every mode) and
// CiliumPodIPPool (multi-pool pools, v2alpha1 in Cilium 1.20).
var crdFiles = []struct {
	fs   fs.FS
	name string
}{
	{crdsv2.EmbedFS, "ciliumnodes.yaml"},
	{crdsv2alpha1.EmbedFS, "ciliumpodippools.yaml"},
}

// lbipamFiles are the CustomResourceDefinitions the LB IPAM mirror writes
// (internal/lbipam): CiliumLoadBalancerIPPool and CiliumCIDRGroup.
var lbipamFiles = []struct {
	fs   fs.FS
	name string
}{
	{crdsv2.EmbedFS, "ciliumloadbalancerippools.yaml"},
	{crdsv2.EmbedFS, "ciliumcidrgroups.yaml"},
}

// CRDs returns Cilium's own definitions of the resources the operator
// uses, read from the Cilium Go module the service is built with, so a
// test cluster validates every write against Cilium's schema.
func CRDs() ([]*apiextensionsv1.CustomResourceDefinition, error) { return read(crdFiles) }

// LBIPAM returns Cilium's definitions of the resources the LB IPAM
// mirror writes, from the same module.
func LBIPAM() ([]*apiextensionsv1.CustomResourceDefinition, error) { return read(lbipamFiles) }

func read(files []struct {
	fs   fs.FS
	name string
}) ([]*apiextensionsv1.CustomResourceDefinition, error) {
	out := make([]*apiextensionsv1.CustomResourceDefinition, 0, len(files))
	for _, f := range files {
		b, err := fs.ReadFile(f.fs, f.name)
		if err != nil {
			return nil, fmt.Errorf("cilium CRD %s: %w", f.name, err)
		}
		crd := new(apiextensionsv1.CustomResourceDefinition)
		if err := yaml.UnmarshalStrict(b, crd); err != nil {
			return nil, fmt.Errorf("cilium CRD %s: %w", f.name, err)
		}
		out = append(out, crd)
	}
	return out, nil
}
