// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package armfake

import (
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v7"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v7"
)

// The lists Cilium's Azure resync makes, paged with nextLink as ARM pages
// them: a resource group's NICs (those of standalone VMs: a scale set's
// NICs are not resources of the group), its scale sets, and all the NICs
// of one scale set.

// defaultPageSize is ARM's usual page of a list.
const defaultPageSize = 100

// SetPageSize makes the lists answer n items a page (n > 0).
func (s *Server) SetPageSize(n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.pageSize = n
}

// groupOf is the lower-cased resource group ID path starts with, and its
// name as path spells it; "" when path names none.
func groupOf(path string) (prefix, name string) {
	segs := strings.Split(path, "/")
	// "", "subscriptions", id, "resourceGroups", name, ...
	if len(segs) < 5 || !strings.EqualFold(segs[1], "subscriptions") || !strings.EqualFold(segs[3], "resourceGroups") {
		return "", ""
	}
	return key(strings.Join(segs[:5], "/")) + "/", segs[4]
}

// isSetNICList: lower is ".../virtualmachinescalesets/{set}/networkinterfaces".
func isSetNICList(lower string) bool {
	rest, ok := strings.CutSuffix(lower, "/networkinterfaces")
	if !ok {
		return false
	}
	i := strings.LastIndex(rest, "/virtualmachinescalesets/")
	return i >= 0 && !strings.Contains(rest[i+len("/virtualmachinescalesets/"):], "/")
}

// page answers items[from:] up to the page size, and the nextLink of the
// rest ("" when none is left), from the request's $skiptoken.
func page[T any](s *Server, r *http.Request, path string, items []T) ([]T, *string) {
	size := s.pageSize
	if size <= 0 {
		size = defaultPageSize
	}
	from, _ := strconv.Atoi(r.URL.Query().Get("$skiptoken"))
	from = min(max(from, 0), len(items))
	to := min(from+size, len(items))
	if to == len(items) {
		return items[from:to], nil
	}
	q := r.URL.Query()
	q.Set("$skiptoken", strconv.Itoa(to))
	next := s.base + path + "?" + q.Encode()
	return items[from:to], &next
}

func (s *Server) listGroupNICsLocked(w http.ResponseWriter, r *http.Request, path string) {
	group, _ := groupOf(path)
	if group == "" {
		writeError(w, notFound("Microsoft.Resources/resourceGroups", path))
		return
	}
	var ids []string
	for k, n := range s.nics {
		if strings.HasPrefix(k, group+"providers/microsoft.network/networkinterfaces/") {
			ids = append(ids, n.id)
		}
	}
	s.writeNICsLocked(w, r, path, ids)
}

// setIDs are the resource IDs of the scale sets of group (groupOf), as
// their instances' IDs spell them, sorted.
func (s *Server) setIDsLocked(group string) []string {
	seen := map[string]string{}
	for _, v := range s.sets {
		for _, nicID := range v.nics {
			vmID := s.nics[key(nicID)].vm
			setID, _, ok := strings.Cut(vmID, "/virtualMachines/")
			if ok && strings.HasPrefix(key(setID), group) {
				seen[key(setID)] = setID
			}
		}
	}
	out := make([]string, 0, len(seen))
	for _, id := range seen {
		out = append(out, id)
	}
	slices.Sort(out)
	return out
}

func (s *Server) listSetsLocked(w http.ResponseWriter, r *http.Request, path string) {
	group, _ := groupOf(path)
	if group == "" {
		writeError(w, notFound("Microsoft.Resources/resourceGroups", path))
		return
	}
	var all []*armcompute.VirtualMachineScaleSet
	for _, id := range s.setIDsLocked(group) {
		all = append(all, &armcompute.VirtualMachineScaleSet{ID: to.Ptr(id), Name: to.Ptr(id[strings.LastIndex(id, "/")+1:])})
	}
	items, next := page(s, r, path, all)
	writeJSON(w, http.StatusOK, armcompute.VirtualMachineScaleSetListResult{Value: items, NextLink: next})
}

func (s *Server) listSetAllNICsLocked(w http.ResponseWriter, r *http.Request, path string) {
	set := key(strings.TrimSuffix(path, "/networkInterfaces")) + "/virtualmachines/"
	var ids []string
	for k, n := range s.nics {
		if strings.HasPrefix(k, set) {
			ids = append(ids, n.id)
		}
	}
	if len(ids) == 0 {
		// A scale set without instances is one ARM does not know here.
		writeError(w, notFound("Microsoft.Compute/virtualMachineScaleSets", strings.TrimSuffix(path, "/networkInterfaces")))
		return
	}
	s.writeNICsLocked(w, r, path, ids)
}

// writeNICsLocked answers the page r asks of the NICs ids, by ID.
func (s *Server) writeNICsLocked(w http.ResponseWriter, r *http.Request, path string, ids []string) {
	slices.Sort(ids)
	var all []*armnetwork.Interface
	for _, id := range ids {
		n := nicJSON(s.nics[key(id)])
		all = append(all, &n)
	}
	items, next := page(s, r, path, all)
	writeJSON(w, http.StatusOK, armnetwork.InterfaceListResult{Value: items, NextLink: next})
}
