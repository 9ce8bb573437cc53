// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package cilium

import (
	"context"

	ipamtypes "github.com/cilium/cilium/pkg/ipam/types"
	ciliumv2 "github.com/cilium/cilium/pkg/k8s/apis/cilium.io/v2"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// CiliumNodeState reads the named node's CiliumNode for the API: from the
// informer cache while this replica leads, else with one GET (followers
// keep no cache). ok is false when the node has none or lives in another
// space than the operator's.
func (o *Operator) CiliumNodeState(ctx context.Context, space, node string) (st alloc.CiliumNodeState, ok bool, err error) {
	if space != o.cfg.Space {
		return st, false, nil
	}
	cn, err := o.cachedCiliumNode(node)
	if err != nil || cn == nil {
		cn, err = o.cilium.CiliumV2().CiliumNodes().Get(ctx, node, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			return st, false, nil
		}
		if err != nil {
			return st, false, err
		}
	}
	return stateOf(o.cfg.Mode, cn), true, nil
}

// stateOf summarises a CiliumNode in the mode's terms.
func stateOf(m Mode, cn *ciliumv2.CiliumNode) alloc.CiliumNodeState {
	st := alloc.CiliumNodeState{Mode: string(m), ResourceVersion: cn.ResourceVersion,
		OperatorError: cn.Status.IPAM.OperatorStatus.Error}
	switch m {
	case ModeCRD:
		fams := crdFamilies(cn)
		st.IPv4 = familyState(fams[0].pool, fams[0].used, fams[0].release)
		st.IPv6 = familyState(fams[1].pool, fams[1].used, fams[1].release)
	case ModeClusterPool:
		for _, p := range cn.Spec.IPAM.PodCIDRs {
			st.PodCIDRs = append(st.PodCIDRs, p.Prefix)
		}
	case ModeMultiPool:
		needs := map[string]ipamtypes.IPAMPoolDemand{}
		for _, r := range cn.Spec.IPAM.Pools.Requested {
			needs[r.Pool] = r.Needed
		}
		for _, a := range cn.Spec.IPAM.Pools.Allocated {
			ps := alloc.CiliumPoolState{Pool: a.Pool, NeededIPv4: needs[a.Pool].IPv4Addrs, NeededIPv6: needs[a.Pool].IPv6Addrs}
			for _, c := range a.CIDRs {
				ps.Allocated = append(ps.Allocated, c.Prefix)
			}
			delete(needs, a.Pool)
			st.Pools = append(st.Pools, ps)
		}
		for _, r := range cn.Spec.IPAM.Pools.Requested {
			if n, waiting := needs[r.Pool]; waiting {
				st.Pools = append(st.Pools, alloc.CiliumPoolState{Pool: r.Pool, NeededIPv4: n.IPv4Addrs, NeededIPv6: n.IPv6Addrs})
			}
		}
	}
	return st
}

func familyState(pool, used ipamtypes.AllocationMap, release map[string]ipamtypes.IPReleaseStatus) *alloc.CiliumFamilyState {
	f := &alloc.CiliumFamilyState{Pool: len(pool), Used: len(used)}
	for _, s := range release {
		switch s {
		case releaseMarked:
			f.MarkedForRelease++
		case releaseReady:
			f.ReadyForRelease++
		case releaseDoNotRelease:
			f.DoNotRelease++
		case releaseReleased:
			f.Released++
		}
	}
	return f
}
