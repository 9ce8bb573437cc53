// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

// Package ipamv1 holds the Go types and the chi strict server interface
// generated from api/openapi.yaml: the server's side of the contract. Its
// client is api/ipamclient, generated from the same contract; clients
// (ipamctl, the CNI plugin, the benchmark, tests) use that one. Do not edit
// ipamv1.gen.go: change the contract and run `go generate ./...`.
package ipamv1

//go:generate go tool oapi-codegen -config cfg.yaml ../openapi.yaml
