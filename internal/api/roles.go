// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package api

import (
	"net/http"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// access is who may call one operation.
type access struct {
	method, path string // as in api/openapi.yaml, checked by TestRoleTableMatchesSpec
	// min is the lowest of viewer < operator < admin that may call it;
	// public when anyone may, without credentials.
	min alloc.Role
	// ownNode lets a node certificate call it on its own {node}.
	ownNode bool
}

// public marks the operations that need no credentials (probes).
const public alloc.Role = ""

// operations declares the role of every operation of api/openapi.yaml, by
// operationId: the one place the API's access rules live. A test fails
// when an operation of the spec is missing here (a new endpoint must be
// given a role) or when an entry names an operation, method or path the
// spec lacks.
//
// The roles: admin everything (tokens and address spaces only
// admins); operator pools (Pod and VIP), nodes, blocks and leases; viewer every read; a
// node its own node's leases and blocks (what the CNI plugin and a node
// agent use), but not deleting its node, which releases everything and is
// an operator's decision.
var operations = map[string]access{
	"getHealthz": {http.MethodGet, "/healthz", public, false},
	"getReadyz":  {http.MethodGet, "/readyz", public, false},

	"listSpaces":  {http.MethodGet, "/v1/spaces", alloc.RoleViewer, false},
	"createSpace": {http.MethodPost, "/v1/spaces", alloc.RoleAdmin, false},
	"getSpace":    {http.MethodGet, "/v1/spaces/{space}", alloc.RoleViewer, false},
	"deleteSpace": {http.MethodDelete, "/v1/spaces/{space}", alloc.RoleAdmin, false},

	"listPools":       {http.MethodGet, "/v1/pools", alloc.RoleViewer, false},
	"createPool":      {http.MethodPost, "/v1/pools", alloc.RoleOperator, false},
	"getPool":         {http.MethodGet, "/v1/pools/{pool}", alloc.RoleViewer, false},
	"updatePool":      {http.MethodPut, "/v1/pools/{pool}", alloc.RoleOperator, false},
	"deletePool":      {http.MethodDelete, "/v1/pools/{pool}", alloc.RoleOperator, false},
	"getPoolCapacity": {http.MethodGet, "/v1/pools/{pool}/capacity", alloc.RoleViewer, false},
	"listPoolBlocks":  {http.MethodGet, "/v1/pools/{pool}/blocks", alloc.RoleViewer, false},

	"listLBPools":  {http.MethodGet, "/v1/lb-pools", alloc.RoleViewer, false},
	"createLBPool": {http.MethodPost, "/v1/lb-pools", alloc.RoleOperator, false},
	"getLBPool":    {http.MethodGet, "/v1/lb-pools/{pool}", alloc.RoleViewer, false},
	"updateLBPool": {http.MethodPut, "/v1/lb-pools/{pool}", alloc.RoleOperator, false},
	"deleteLBPool": {http.MethodDelete, "/v1/lb-pools/{pool}", alloc.RoleOperator, false},

	"listVIPOwners": {http.MethodGet, "/v1/vip-owners", alloc.RoleViewer, false},
	"assignVIPs":    {http.MethodPut, "/v1/vip-owners/{namespace}/{name}", alloc.RoleOperator, false},
	"getVIPs":       {http.MethodGet, "/v1/vip-owners/{namespace}/{name}", alloc.RoleViewer, false},
	"releaseVIPs":   {http.MethodDelete, "/v1/vip-owners/{namespace}/{name}", alloc.RoleOperator, false},

	"listCIDRGroups":       {http.MethodGet, "/v1/cidr-groups", alloc.RoleViewer, false},
	"createCIDRGroup":      {http.MethodPost, "/v1/cidr-groups", alloc.RoleOperator, false},
	"getCIDRGroup":         {http.MethodGet, "/v1/cidr-groups/{group}", alloc.RoleViewer, false},
	"updateCIDRGroup":      {http.MethodPut, "/v1/cidr-groups/{group}", alloc.RoleOperator, false},
	"deleteCIDRGroup":      {http.MethodDelete, "/v1/cidr-groups/{group}", alloc.RoleOperator, false},
	"getAddressCIDRGroups": {http.MethodGet, "/v1/addresses/{address}/cidr-groups", alloc.RoleViewer, false},

	"listNodes":    {http.MethodGet, "/v1/nodes", alloc.RoleViewer, false},
	"getNode":      {http.MethodGet, "/v1/nodes/{node}", alloc.RoleViewer, true},
	"putNode":      {http.MethodPut, "/v1/nodes/{node}", alloc.RoleOperator, true},
	"deleteNode":   {http.MethodDelete, "/v1/nodes/{node}", alloc.RoleOperator, false},
	"getNodeUsage": {http.MethodGet, "/v1/nodes/{node}/pools", alloc.RoleViewer, true},

	"listBlocks":   {http.MethodGet, "/v1/nodes/{node}/blocks", alloc.RoleViewer, true},
	"carveBlock":   {http.MethodPost, "/v1/nodes/{node}/blocks", alloc.RoleOperator, true},
	"releaseBlock": {http.MethodDelete, "/v1/nodes/{node}/blocks", alloc.RoleOperator, true},

	"allocateLease":     {http.MethodPost, "/v1/nodes/{node}/leases", alloc.RoleOperator, true},
	"getAttachment":     {http.MethodGet, "/v1/nodes/{node}/attachments/{containerID}/{interface}", alloc.RoleViewer, true},
	"releaseAttachment": {http.MethodDelete, "/v1/nodes/{node}/attachments/{containerID}/{interface}", alloc.RoleOperator, true},
	"confirmAttachment": {http.MethodPost, "/v1/nodes/{node}/attachments/{containerID}/{interface}/confirm", alloc.RoleOperator, true},
	"reconcileNode":     {http.MethodPost, "/v1/nodes/{node}/reconcile", alloc.RoleOperator, true},
	// A runtime reads the watermark before taking its list (CNI GC).
	"getReconcileWatermark": {http.MethodGet, "/v1/nodes/{node}/reconcile", alloc.RoleViewer, true},
	"listLeases":            {http.MethodGet, "/v1/leases", alloc.RoleViewer, false},
	"getAddress":            {http.MethodGet, "/v1/addresses/{address}", alloc.RoleViewer, false},
	"releaseAddress":        {http.MethodDelete, "/v1/addresses/{address}", alloc.RoleOperator, false},

	"getSizing": {http.MethodGet, "/v1/sizing", alloc.RoleViewer, false},

	"getAddressHistory": {http.MethodGet, "/v1/addresses/{address}/history", alloc.RoleViewer, false},
	"listHistory":       {http.MethodGet, "/v1/history", alloc.RoleViewer, false},
	// Reads whole tables for seconds on a large database.
	"checkConsistency": {http.MethodGet, "/v1/consistency", alloc.RoleAdmin, false},

	// Bindings of workload identities to addresses outlive nodes: operators
	// only, never a node.
	"getStickyBindings":    {http.MethodGet, "/v1/sticky-bindings", alloc.RoleViewer, false},
	"deleteStickyBindings": {http.MethodDelete, "/v1/sticky-bindings", alloc.RoleOperator, false},

	"listTokens":  {http.MethodGet, "/v1/tokens", alloc.RoleAdmin, false},
	"createToken": {http.MethodPost, "/v1/tokens", alloc.RoleAdmin, false},
	"revokeToken": {http.MethodDelete, "/v1/tokens/{name}", alloc.RoleAdmin, false},
}

// operationsByRoute finds an operation by method and chi route pattern,
// which are the spec's path templates.
// debugRoutes are the routes outside the API contract that the gate
// guards: the Go profiler (Options.Pprof) shows memory and stacks, and
// costs CPU while it profiles, so only an admin may use it.
var debugRoutes = map[string]access{
	http.MethodGet + " " + pprofRoute: {http.MethodGet, pprofRoute, alloc.RoleAdmin, false},
}

// uiRoutes are the routes of the web view, outside the API contract. All
// are public: the shell carries no data (every figure comes from /v1
// under the caller's credentials), and signing in or out needs no prior
// credential; signIn checks the token itself and counts failures against
// the caller's address, as the gate counts failed authentications.
var uiRoutes = map[string]access{
	http.MethodGet + " " + uiPrefix:        {http.MethodGet, uiPrefix, public, false},
	http.MethodGet + " " + uiRoute:         {http.MethodGet, uiRoute, public, false},
	http.MethodHead + " " + uiRoute:        {http.MethodHead, uiRoute, public, false},
	http.MethodPost + " " + sessionRoute:   {http.MethodPost, sessionRoute, public, false},
	http.MethodDelete + " " + sessionRoute: {http.MethodDelete, sessionRoute, public, false},
}

var operationsByRoute = func() map[string]string {
	m := make(map[string]string, len(operations))
	for id, a := range operations {
		m[a.method+" "+a.path] = id
	}
	return m
}()

// allows reports whether id may call a: by rank, or as the node named in
// the request's path, in its own space. node and space are what the
// handler works on: the unescaped {node} and the space query parameter
// (alloc.DefaultSpace when absent).
func (a access) allows(id identity, node, space string) bool {
	switch {
	case a.min == public:
		return true
	case id.role == alloc.RoleNode:
		return a.ownNode && node != "" && node == id.node && space == id.space
	}
	return id.role.AtLeast(a.min)
}
