// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package alloc

import (
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// DefaultSpace and DefaultPool are the names used when a request names none.
const (
	DefaultSpace = "default"
	DefaultPool  = "default"
)

// ValidateLabelName checks a space or pool name: a DNS label (RFC 1123), as
// Kubernetes requires of most object names.
func ValidateLabelName(field, name string) error {
	if name == "" {
		return Invalid(field, "must not be empty")
	}
	if errs := validation.IsDNS1123Label(name); len(errs) > 0 {
		return Invalid(field, "%q is not a DNS label: %s", name, strings.Join(errs, "; "))
	}
	return nil
}

// ValidateNodeName checks a node name: a DNS subdomain, as Kubernetes
// requires of Node objects.
func ValidateNodeName(field, name string) error {
	if name == "" {
		return Invalid(field, "must not be empty")
	}
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return Invalid(field, "%q is not a DNS subdomain: %s", name, strings.Join(errs, "; "))
	}
	return nil
}

// MaxLabels bounds the labels of one object or selector; Kubernetes
// bounds only an object's size, and no pool or node needs more.
const MaxLabels = 128

// ValidateLabels checks keys and values with Kubernetes' label rules, and
// their number.
func ValidateLabels(field string, labels map[string]string) error {
	if len(labels) > MaxLabels {
		return Invalid(field, "has %d labels; at most %d are allowed", len(labels), MaxLabels)
	}
	return ValidateKubernetesLabels(field, labels)
}

// ValidateKubernetesLabels checks keys and values with Kubernetes' label
// rules, however many there are: for labels read from a Kubernetes object
// (a Node's, which node-feature-discovery alone can give hundreds), whose
// size the API server bounds.
func ValidateKubernetesLabels(field string, labels map[string]string) error {
	for k, v := range labels {
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			return Invalid(fmt.Sprintf("%s[%s]", field, k), "invalid label key: %s", strings.Join(errs, "; "))
		}
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			return Invalid(fmt.Sprintf("%s[%s]", field, k), "invalid label value: %s", strings.Join(errs, "; "))
		}
	}
	return nil
}

// MaxAnnotationBytes bounds the annotations a request may carry, as the
// Kubernetes API server bounds an object's (256 KiB in total); at most
// MaxAnnotations of them.
const (
	MaxAnnotationBytes = 256 << 10
	MaxAnnotations     = 1024
)

// ValidateAnnotations checks annotation keys with Kubernetes' rules and
// bounds their total size.
func ValidateAnnotations(field string, ann map[string]string) error {
	if len(ann) > MaxAnnotations {
		return Invalid(field, "has %d annotations; at most %d are allowed", len(ann), MaxAnnotations)
	}
	total := 0
	for k, v := range ann {
		if errs := validation.IsQualifiedName(k); len(errs) > 0 {
			return Invalid(fmt.Sprintf("%s[%s]", field, k), "invalid annotation key: %s", strings.Join(errs, "; "))
		}
		total += len(k) + len(v)
	}
	if total > MaxAnnotationBytes {
		return Invalid(field, "annotations take %d bytes; at most %d are allowed", total, MaxAnnotationBytes)
	}
	return nil
}

// validateToken checks free-form identifiers such as container IDs and
// interface names: printable ASCII without spaces or slashes, bounded.
func validateToken(field, s string, max int) error {
	if s == "" {
		return Invalid(field, "must not be empty")
	}
	if len(s) > max {
		return Invalid(field, "longer than %d characters", max)
	}
	for _, r := range s {
		if r <= ' ' || r > '~' || r == '/' {
			return Invalid(field, "contains %q; only printable ASCII without spaces or '/' is allowed", r)
		}
	}
	return nil
}

// ValidateNetworkName checks the name of a CNI network: empty (the unnamed
// network), or as libcni accepts it, a letter or digit followed by letters,
// digits, '_', '.' and '-', at most 253 characters.
func ValidateNetworkName(field, s string) error {
	if len(s) > 253 {
		return Invalid(field, "longer than 253 characters")
	}
	for i, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9':
		case i > 0 && (r == '_' || r == '.' || r == '-'):
		default:
			return Invalid(field, "%q is not a CNI network name (a letter or digit, then letters, digits, '_', '.', '-')", s)
		}
	}
	return nil
}
