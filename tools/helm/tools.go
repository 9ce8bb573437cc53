// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

//go:build tools

// Package tools pins the commands this module builds.
package tools

import (
	_ "helm.sh/helm/v4/cmd/helm"
)
