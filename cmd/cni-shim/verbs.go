package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"slices"
	"strings"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/ipam-dev/ipam/api/ipamv1"
)

// call is one verb's configuration, client and deadline.
type call struct {
	cfg    *config
	client *ipamv1.ClientWithResponses
	ctx    context.Context
}

func newCall(args *skel.CmdArgs) (*call, context.CancelFunc, error) {
	cfg, err := loadConfig(args.StdinData)
	if err != nil {
		return nil, nil, err
	}
	cl, err := newClient(cfg)
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), cfg.timeout)
	return &call{cfg: cfg, client: cl, ctx: ctx}, cancel, nil
}

func (c *call) space() *ipamv1.SpaceParam {
	if c.cfg.space == "" {
		return nil
	}
	s := c.cfg.space
	return &s
}

func cmdAdd(args *skel.CmdArgs) error {
	c, cancel, err := newCall(args)
	if err != nil {
		return err
	}
	defer cancel()
	owner, err := c.cfg.owner(args.Args, args.ContainerID)
	if err != nil {
		return err
	}
	expire := true
	req := ipamv1.LeaseRequest{ContainerID: args.ContainerID, Interface: args.IfName, Owner: owner, Expire: &expire}
	if c.cfg.pool != "" {
		req.Pool = &c.cfg.pool
	}
	if len(c.cfg.pools) > 0 {
		req.Pools = &ipamv1.FamilyPools{}
		if n, ok := c.cfg.pools[ipamv1.Ipv4]; ok {
			req.Pools.Ipv4 = &n
		}
		if n, ok := c.cfg.pools[ipamv1.Ipv6]; ok {
			req.Pools.Ipv6 = &n
		}
	}
	if len(c.cfg.families) > 0 {
		req.Families = &c.cfg.families
	}
	r, err := c.client.AllocateLeaseWithResponse(c.ctx, c.cfg.node, &ipamv1.AllocateLeaseParams{Space: c.space()}, req)
	if err != nil {
		return transportError("allocate", err)
	}
	alloc := r.JSON201
	if alloc == nil {
		alloc = r.JSON200 // a retry: the same addresses
	}
	if alloc == nil {
		return problemError("allocate", r.StatusCode(), r.ApplicationproblemJSONDefault, r.Body)
	}
	// Confirm the leases this ADD got and no others: if they were released
	// and the attachment leased again meanwhile, the confirm is refused.
	conf, err := c.client.ConfirmAttachmentWithResponse(c.ctx, c.cfg.node, args.ContainerID, args.IfName,
		&ipamv1.ConfirmAttachmentParams{Space: c.space(), Generation: &alloc.Generation})
	if err != nil {
		return transportError("confirm", err)
	}
	if conf.JSON200 == nil {
		return problemError("confirm", conf.StatusCode(), conf.ApplicationproblemJSONDefault, conf.Body)
	}
	result, err := c.result(alloc)
	if err != nil {
		return err
	}
	return types.PrintResult(result, c.cfg.net.CNIVersion)
}

// result is the CNI result of an allocation: the addresses IPv4 first, a
// default route per family via its gateway (unless disabled), the
// configured routes and the configured DNS.
func (c *call) result(a *ipamv1.Allocation) (*current.Result, error) {
	res := &current.Result{CNIVersion: current.ImplementedSpecVersion, DNS: c.cfg.net.DNS}
	addrs := slices.Clone(a.Addresses)
	slices.SortStableFunc(addrs, func(x, y ipamv1.LeaseAddress) int { return strings.Compare(string(x.Family), string(y.Family)) })
	for _, la := range addrs {
		p, err := netip.ParsePrefix(la.Address)
		if err != nil {
			return nil, types.NewError(ErrService, fmt.Sprintf("allocate: the service answered address %q", la.Address), err.Error())
		}
		ipc := &current.IPConfig{Address: net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}}
		if la.Gateway != nil && *la.Gateway != "" {
			gw, err := netip.ParseAddr(*la.Gateway)
			if err != nil {
				return nil, types.NewError(ErrService, fmt.Sprintf("allocate: the service answered gateway %q", *la.Gateway), err.Error())
			}
			ipc.Gateway = gw.AsSlice()
			if c.cfg.defaultRoute {
				res.Routes = append(res.Routes, &types.Route{
					Dst: net.IPNet{IP: net.IP(netip.IPv6Unspecified().AsSlice()), Mask: net.CIDRMask(0, 128)},
					GW:  ipc.Gateway,
				})
				if gw.Is4() {
					res.Routes[len(res.Routes)-1].Dst = net.IPNet{IP: net.IPv4zero.To4(), Mask: net.CIDRMask(0, 32)}
				}
			}
		}
		res.IPs = append(res.IPs, ipc)
	}
	res.Routes = append(res.Routes, c.cfg.routes...)
	return res, nil
}

func cmdDel(args *skel.CmdArgs) error {
	c, cancel, err := newCall(args)
	if err != nil {
		return err
	}
	defer cancel()
	r, err := c.client.ReleaseAttachmentWithResponse(c.ctx, c.cfg.node, args.ContainerID, args.IfName, &ipamv1.ReleaseAttachmentParams{Space: c.space()})
	if err != nil {
		return transportError("release", err)
	}
	if r.StatusCode() == http.StatusNoContent || isNotFound(r.StatusCode(), r.ApplicationproblemJSONDefault) {
		return nil // released, nothing held, or a node or space the service does not know
	}
	return problemError("release", r.StatusCode(), r.ApplicationproblemJSONDefault, r.Body)
}

func cmdCheck(args *skel.CmdArgs) error {
	c, cancel, err := newCall(args)
	if err != nil {
		return err
	}
	defer cancel()
	prev, err := prevResult(args.StdinData)
	if err != nil {
		return err
	}
	r, err := c.client.GetAttachmentWithResponse(c.ctx, c.cfg.node, args.ContainerID, args.IfName, &ipamv1.GetAttachmentParams{Space: c.space()})
	if err != nil {
		return transportError("check", err)
	}
	if r.JSON200 == nil {
		return problemError("check", r.StatusCode(), r.ApplicationproblemJSONDefault, r.Body)
	}
	var held, want []string
	for _, la := range r.JSON200.Addresses {
		p, err := netip.ParsePrefix(la.Address)
		if err != nil {
			return types.NewError(ErrService, fmt.Sprintf("check: the service answered address %q", la.Address), err.Error())
		}
		held = append(held, p.String())
	}
	for _, ipc := range prev.IPs {
		a, ok := netip.AddrFromSlice(ipc.Address.IP)
		ones, _ := ipc.Address.Mask.Size()
		if !ok {
			return types.NewError(types.ErrDecodingFailure, "check: prevResult holds an invalid address", "")
		}
		want = append(want, netip.PrefixFrom(a.Unmap(), ones).String())
	}
	slices.Sort(held)
	slices.Sort(want)
	if !slices.Equal(held, want) {
		return types.NewError(ErrCheckMismatch,
			fmt.Sprintf("check: prevResult has %v but the service holds %v for %s/%s", want, held, args.ContainerID, args.IfName), "")
	}
	return nil
}

// prevResult is the prevResult of stdin in the current result version;
// CHECK without one is an error.
func prevResult(stdin []byte) (*current.Result, error) {
	var pc types.PluginConf
	if err := json.Unmarshal(stdin, &pc); err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, "cannot decode network configuration: "+err.Error(), "")
	}
	if pc.RawPrevResult == nil {
		return nil, types.NewError(types.ErrInvalidNetworkConfig, "invalid network configuration: prevResult: missing, CHECK needs it", "")
	}
	if err := version.ParsePrevResult(&pc); err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, "invalid network configuration: prevResult: "+err.Error(), "")
	}
	res, err := current.NewResultFromResult(pc.PrevResult)
	if err != nil {
		return nil, types.NewError(types.ErrDecodingFailure, "invalid network configuration: prevResult: "+err.Error(), "")
	}
	return res, nil
}

func cmdGC(args *skel.CmdArgs) error {
	c, cancel, err := newCall(args)
	if err != nil {
		return err
	}
	defer cancel()
	valid := c.cfg.net.ValidAttachments
	if valid == nil {
		valid = c.cfg.net.LegacyAttachments
	}
	if valid == nil {
		return nil // no list: nothing is known to be stale
	}
	req := ipamv1.ReconcileRequest{Attachments: []ipamv1.AttachmentRef{}}
	for _, a := range *valid {
		req.Attachments = append(req.Attachments, ipamv1.AttachmentRef{ContainerID: a.ContainerID, Interface: a.IfName})
	}
	r, err := c.client.ReconcileNodeWithResponse(c.ctx, c.cfg.node, &ipamv1.ReconcileNodeParams{Space: c.space()}, req)
	if err != nil {
		return transportError("gc", err)
	}
	if r.JSON200 != nil {
		logKept(c.cfg.node, len(r.JSON200.Released), r.JSON200.Kept)
		return nil
	}
	if isNotFound(r.StatusCode(), r.ApplicationproblemJSONDefault) {
		return nil // a node the service does not know holds nothing
	}
	return problemError("gc", r.StatusCode(), r.ApplicationproblemJSONDefault, r.Body)
}

func cmdStatus(args *skel.CmdArgs) error {
	c, cancel, err := newCall(args)
	if err != nil {
		return err
	}
	defer cancel()
	if e := c.canServeAdd(); e != nil {
		return e
	}
	return nil
}
