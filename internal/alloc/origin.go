// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package alloc

import "fmt"

// Origin says who owns a VIP pool or a CIDR group, and so who may change
// it. The zero value is the database: made through the REST API, mirrored
// into the cluster read-only. A Kubernetes origin is a
// CiliumLoadBalancerIPPool or CiliumCIDRGroup of the cluster, imported by
// the LB IPAM controller: only the controller, following the object,
// edits or deletes it.
type Origin struct {
	// Source is OriginDatabase ("" reads as it) or OriginKubernetes.
	Source string
	// UID is the Kubernetes object's metadata.uid; empty for the
	// database.
	UID string
}

// The values of Origin.Source, as the store keeps them.
const (
	OriginDatabase   = "database"
	OriginKubernetes = "kubernetes"
)

// FromKubernetes is the origin of an object of the cluster of uid.
func FromKubernetes(uid string) Origin { return Origin{Source: OriginKubernetes, UID: uid} }

// Kubernetes reports whether a Kubernetes object owns the row.
func (o Origin) Kubernetes() bool { return o.Source == OriginKubernetes }

// Stored is o as the store's columns keep it (source, source_uid).
func (o Origin) Stored() (source, uid string) {
	if o.Kubernetes() {
		return OriginKubernetes, o.UID
	}
	return OriginDatabase, ""
}

// Validate refuses a Kubernetes origin without a UID.
func (o Origin) Validate() error {
	switch {
	case o.Source != "" && o.Source != OriginDatabase && o.Source != OriginKubernetes:
		return Invalid("origin", "source %q: want %s or %s", o.Source, OriginDatabase, OriginKubernetes)
	case o.Kubernetes() && o.UID == "":
		return Invalid("origin", "a Kubernetes origin needs the object's UID")
	}
	return nil
}

// NotOwner is the refusal of a write by a writer that does not own the
// row: what (a "VIP pool" or a "CIDR group") of name is the owner's to
// change.
func NotOwner(what, name string, owner Origin, kind string) error {
	if owner.Kubernetes() {
		return &Error{Kind: KindConflict, Field: "name", Detail: fmt.Sprintf(
			"%s %q is owned by the %s of that name in the cluster; edit or delete the object instead", what, name, kind)}
	}
	return &Error{Kind: KindConflict, Field: "name", Detail: fmt.Sprintf(
		"%s %q is owned by the database (made through the REST API); the cluster's object is its read-only mirror", what, name)}
}

// AsOrigin makes a write speak for origin: a VIP pool or CIDR group is
// edited or deleted only by a writer of its own origin (the zero value,
// the REST API's, unless set).
func AsOrigin(o Origin) WriteOption { return func(w *WriteOptions) { w.Origin = o } }
