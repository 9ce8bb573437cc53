// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

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

	"github.com/ipam-dev/ipam/api/ipamclient"
)

// call is one verb's configuration, client and deadline.
type call struct {
	cfg    *config
	client *ipamclient.ClientWithResponses
	ctx    context.Context
	// stdin is the network configuration, for the background sync.
	stdin []byte
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
	return &call{cfg: cfg, client: cl, ctx: ctx, stdin: args.StdinData}, cancel, nil
}

// network is the attachment's CNI network: the configuration's name.
func (c *call) network() *string {
	if c.cfg.net.Name == "" {
		return nil
	}
	n := c.cfg.net.Name
	return &n
}

func (c *call) space() *ipamclient.SpaceParam {
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
	if c.fastPath() && servable(args.ContainerID, args.IfName, owner) {
		alloc, err := c.addFast(args.ContainerID, args.IfName, owner)
		if err != nil {
			return err
		}
		if alloc != nil {
			return c.printResult(alloc)
		}
	}
	// DELs and reserve handovers recorded while the service was
	// unreachable go first; an unreachable service fails this call alike.
	s, syncErr := c.beginSync(args.ContainerID, args.IfName)
	reachable := !reserveFallback(syncErr)
	alloc := c.served(args.ContainerID, args.IfName) // a retry of an ADD the reserve served
	if alloc == nil {
		err = syncErr
		if err == nil {
			alloc, err = c.allocate(args, owner)
			reachable = !reserveFallback(err)
		}
		if err != nil {
			// The reserve serves while the service is unreachable, and
			// when the pools have nothing left for the node: its slots
			// are the node's addresses too, never stranded.
			if c.cfg.reserve == 0 || !(reserveFallback(err) || isCode(err, ErrPoolExhausted)) {
				s.handOff(reachable)
				return err
			}
			if alloc, err = c.addFromReserve(args.ContainerID, args.IfName, owner, err); err != nil {
				s.handOff(reachable)
				return err
			}
		}
	}
	// The reserve refills in the background, after the answer.
	defer s.handOff(reachable)
	return c.printResult(alloc)
}

// printResult prints the CNI result of alloc.
func (c *call) printResult(alloc *ipamclient.Allocation) error {
	result, err := c.result(alloc)
	if err != nil {
		return err
	}
	return types.PrintResult(result, c.cfg.net.CNIVersion)
}

// leaseRequest is the request of ADD (and of the reserve's slots) for the
// attachment of this network.
func (c *call) leaseRequest(containerID, ifname string, owner ipamclient.Owner, expire bool) ipamclient.LeaseRequest {
	req := ipamclient.LeaseRequest{Network: c.network(), ContainerID: containerID, Interface: ifname, Owner: owner, Expire: &expire}
	if c.cfg.pool != "" {
		req.Pool = &c.cfg.pool
	}
	if len(c.cfg.pools) > 0 {
		req.Pools = &ipamclient.FamilyPools{}
		if n, ok := c.cfg.pools[ipamclient.Ipv4]; ok {
			req.Pools.Ipv4 = &n
		}
		if n, ok := c.cfg.pools[ipamclient.Ipv6]; ok {
			req.Pools.Ipv6 = &n
		}
	}
	if len(c.cfg.families) > 0 {
		req.Families = &c.cfg.families
	}
	return req
}

// allocate leases the attachment's addresses, active at once: one request.
// A pending lease would expire unless confirmed, and the shim cannot learn
// when the main plugin is done (it is called in the middle of the main
// plugin's ADD), so a second request to confirm it at once would only cost
// a round trip and a transaction. A main plugin that fails after IPAM ADD
// is covered by the runtime's DEL, a node that dies by GC.
//
// A retry that finds a pending lease (made by an older shim that died
// before confirming it) confirms it, with the generation it got, so that
// the address cannot expire under the running Pod.
func (c *call) allocate(args *skel.CmdArgs, owner ipamclient.Owner) (*ipamclient.Allocation, error) {
	req := c.leaseRequest(args.ContainerID, args.IfName, owner, false)
	r, err := c.client.AllocateLeaseWithResponse(c.ctx, c.cfg.node, &ipamclient.AllocateLeaseParams{Space: c.space()}, req)
	if err != nil {
		return nil, transportError("allocate", err)
	}
	alloc := r.JSON201
	if alloc == nil {
		alloc = r.JSON200 // a retry: the same addresses
	}
	if alloc == nil {
		return nil, problemError("allocate", r.StatusCode(), r.Body)
	}
	if alloc.State != ipamclient.Pending {
		return alloc, nil
	}
	// Confirm the leases this ADD got and no others: if they were released
	// and the attachment leased again meanwhile, the confirm is refused.
	conf, err := c.client.ConfirmAttachmentWithResponse(c.ctx, c.cfg.node, args.ContainerID, args.IfName,
		&ipamclient.ConfirmAttachmentParams{Space: c.space(), Network: c.network(), Generation: &alloc.Generation})
	if err != nil {
		return nil, transportError("confirm", err)
	}
	if conf.JSON200 == nil {
		return nil, problemError("confirm", conf.StatusCode(), conf.Body)
	}
	return alloc, nil
}

// result is the CNI result of an allocation: the addresses IPv4 first, a
// default route per family via its gateway (unless disabled), the
// configured routes and the configured DNS.
func (c *call) result(a *ipamclient.Allocation) (*current.Result, error) {
	res := &current.Result{CNIVersion: current.ImplementedSpecVersion, DNS: c.cfg.net.DNS}
	addrs := slices.Clone(a.Addresses)
	slices.SortStableFunc(addrs, func(x, y ipamclient.LeaseAddress) int { return strings.Compare(string(x.Family), string(y.Family)) })
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
	if c.fastPath() {
		// Recorded, and sent by the background sync: the address cools
		// down at the service from then on, as after any DEL.
		return c.recordDel(args.ContainerID, args.IfName, true)
	}
	s, err := c.beginSync("", "")
	if err == nil {
		err = c.release(args)
	}
	if err != nil {
		if c.cfg.reserve == 0 || !reserveFallback(err) {
			s.handOff(!reserveFallback(err))
			return err
		}
		s.handOff(false)
		// Recorded and replayed: the reserve makes DEL work offline.
		return c.delOffline(args.ContainerID, args.IfName)
	}
	if c.served(args.ContainerID, args.IfName) != nil {
		// Served by the reserve and not handed over yet (another call
		// holds the sync): back to the reserve, and released at the
		// service should the handover win.
		err = c.delOffline(args.ContainerID, args.IfName)
	}
	s.handOff(true)
	return err
}

func (c *call) release(args *skel.CmdArgs) error {
	r, err := c.client.ReleaseAttachmentWithResponse(c.ctx, c.cfg.node, args.ContainerID, args.IfName, &ipamclient.ReleaseAttachmentParams{Space: c.space(), Network: c.network()})
	if err != nil {
		return transportError("release", err)
	}
	if r.StatusCode() == http.StatusNoContent || isNotFound(r.StatusCode(), r.Body) {
		return nil // released, nothing held, or a node or space the service does not know
	}
	return problemError("release", r.StatusCode(), r.Body)
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
	s, err := c.beginSync("", "") // an unreachable service fails the request below
	s.handOff(err == nil)
	if a := c.served(args.ContainerID, args.IfName); a != nil {
		return checkAddresses(args, a.Addresses, prev, "the node's reserve")
	}
	r, err := c.client.GetAttachmentWithResponse(c.ctx, c.cfg.node, args.ContainerID, args.IfName, &ipamclient.GetAttachmentParams{Space: c.space(), Network: c.network()})
	if err != nil {
		return transportError("check", err)
	}
	if r.JSON200 == nil {
		return problemError("check", r.StatusCode(), r.Body)
	}
	return checkAddresses(args, r.JSON200.Addresses, prev, "the service")
}

// checkAddresses compares prevResult's addresses with those holder holds.
func checkAddresses(args *skel.CmdArgs, addrs []ipamclient.LeaseAddress, prev *current.Result, holder string) error {
	var held, want []string
	for _, la := range addrs {
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
			fmt.Sprintf("check: prevResult has %v but %s holds %v for %s/%s", want, holder, held, args.ContainerID, args.IfName), "")
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
	// Only this network's attachments: the runtime lists them per network.
	req := ipamclient.ReconcileRequest{Network: c.network(), Attachments: []ipamclient.AttachmentRef{}}
	for _, a := range *valid {
		req.Attachments = append(req.Attachments, ipamclient.AttachmentRef{ContainerID: a.ContainerID, Interface: a.IfName})
	}
	// The reserve's slots are this network's attachments too: hold the
	// sync from the handovers to the reconcile, so no slot is leased or
	// handed over in between, and list every slot as valid (a slot the
	// fast path takes meanwhile stays a slot until its handover).
	var s *syncer
	if st, err := readReserve(c.cfg.dataDir); c.cfg.reserve > 0 || err != nil || len(st.Slots) > 0 || st.pending() {
		f, err := flockFile(c.cfg.dataDir, syncLockName, lockWait)
		if err != nil {
			return reserveError("gc", err)
		}
		s = &syncer{c: c, lock: f}
		defer s.close()
		if err := s.drain(); err != nil {
			return err
		}
		r, err := lockReserve(c.cfg.dataDir, lockWait)
		if err != nil {
			return reserveError("gc", err)
		}
		req.Attachments = append(req.Attachments, r.st.attachments()...)
		r.close()
	}
	resp, err := c.client.ReconcileNodeWithResponse(c.ctx, c.cfg.node, &ipamclient.ReconcileNodeParams{Space: c.space()}, req)
	if err != nil {
		return transportError("gc", err)
	}
	if resp.JSON200 == nil && !isNotFound(resp.StatusCode(), resp.Body) {
		return problemError("gc", resp.StatusCode(), resp.Body)
	}
	if resp.JSON200 != nil {
		logKept(c.cfg.node, len(resp.JSON200.Released), resp.JSON200.Kept)
	}
	// Reconciled, or a node the service does not know holds nothing.
	if s != nil {
		s.finish()
	}
	return nil
}

func cmdStatus(args *skel.CmdArgs) error {
	c, cancel, err := newCall(args)
	if err != nil {
		return err
	}
	defer cancel()
	e, exhausted := c.canServeAdd()
	if e == nil {
		// The service answers: bring the reserve up to date.
		if s, err := c.beginSync("", ""); err == nil && s != nil {
			s.finish()
		} else {
			s.close()
		}
		return nil
	}
	// The node's reserve serves ADDs while the service is unreachable or
	// unavailable (code 11), and while the pools have no address left for
	// the node (ADD takes a free slot then); not when the service refuses
	// this node's credentials or a pool the configuration names.
	if (e.Code == types.ErrTryAgainLater || exhausted) && c.reserveReady() {
		return nil
	}
	return e
}
