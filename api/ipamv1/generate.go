// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

// Package ipamv1 holds the Go types, the chi strict server interface and the
// client generated from api/openapi.yaml. Do not edit ipamv1.gen.go: change
// the contract and run `go generate ./...`.
package ipamv1

//go:generate go tool oapi-codegen -config cfg.yaml ../openapi.yaml
