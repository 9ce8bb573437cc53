// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package azure

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/arm"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v7"

	"github.com/ipam-dev/ipam/internal/cloud"
)

var _ cloud.Inventory = (*Provider)(nil)

// groupID is the resource group an instance is listed by: its VPC as
// Instance answers it, "/subscriptions/<id>/resourceGroups/<name>",
// lower-cased, so that nodes whose providerIDs spell the group otherwise
// share one listing.
func groupID(rid *arm.ResourceID) string {
	return fmt.Sprintf("/subscriptions/%s/resourceGroups/%s", strings.ToLower(rid.SubscriptionID), strings.ToLower(rid.ResourceGroupName))
}

// Instances describes every VM and scale set instance of resource group
// group (groupID) with NICs, by lower-cased resource ID (ARM's IDs are
// case-insensitive), as Instance describes each: the group's NICs in one
// paged list (those of its standalone VMs), its scale sets in another,
// and each set's NICs in one more, as Cilium's Azure resync lists them.
// So a pass costs 2 + (scale sets) lists, not a call or two per node. A
// set whose NICs answer 404 (one in Flexible orchestration, whose NICs
// are the group's own) is skipped, as in Cilium. A NIC on no VM is left
// out.
func (p *Provider) Instances(ctx context.Context, group string) (map[string]cloud.Instance, error) {
	rid, err := arm.ParseResourceID(group)
	if err != nil || rid.ResourceGroupName == "" {
		return nil, &cloud.Error{Kind: cloud.KindInvalid, Code: "InvalidResourceGroup", Message: fmt.Sprintf("%q names no resource group", group)}
	}
	rg := rid.ResourceGroupName
	byVM := map[string][]*armnetwork.Interface{}
	spelled := map[string]string{} // lower-cased VM ID -> as ARM spells it
	add := func(nics []*armnetwork.Interface) {
		for _, n := range nics {
			if n == nil || n.Properties == nil || n.Properties.VirtualMachine == nil || str(n.Properties.VirtualMachine.ID) == "" {
				continue
			}
			vm := str(n.Properties.VirtualMachine.ID)
			k := strings.ToLower(vm)
			byVM[k], spelled[k] = append(byVM[k], n), vm
		}
	}
	nics := p.nics.NewListPager(rg, nil)
	for nics.More() {
		page, err := nics.NextPage(ctx)
		if err != nil {
			return nil, classify(err)
		}
		add(page.Value)
	}
	sets := p.sets.NewListPager(rg, nil)
	for sets.More() {
		page, err := sets.NextPage(ctx)
		if err != nil {
			return nil, classify(err)
		}
		for _, set := range page.Value {
			if set == nil || str(set.Name) == "" {
				continue
			}
			if err := p.listSetNICs(ctx, rg, str(set.Name), add); err != nil {
				return nil, err
			}
		}
	}
	out := make(map[string]cloud.Instance, len(byVM))
	for k, nics := range byVM {
		id := spelled[k]
		vrid, err := arm.ParseResourceID(id)
		if err != nil {
			return nil, fmt.Errorf("NIC on VM %q: %w", id, err)
		}
		inst, err := p.instanceOf(ctx, id, vrid, nics)
		if err != nil {
			return nil, err
		}
		out[k] = inst
	}
	return out, nil
}

// listSetNICs hands add every NIC of scale set set, page by page; a 404
// is no error.
func (p *Provider) listSetNICs(ctx context.Context, rg, set string, add func([]*armnetwork.Interface)) error {
	pager := p.nics.NewListVirtualMachineScaleSetNetworkInterfacesPager(rg, set, nil)
	for pager.More() {
		page, err := pager.NextPage(ctx)
		var re *azcore.ResponseError
		if errors.As(err, &re) && re.StatusCode == http.StatusNotFound {
			return nil
		} else if err != nil {
			return classify(err)
		}
		add(page.Value)
	}
	return nil
}
