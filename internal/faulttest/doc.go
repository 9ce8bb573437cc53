// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

// Package faulttest holds the fault tests of the service: real server
// processes (the ipam-server binary, built once per test run) on one
// PostgreSQL database, under concurrent clients, while a replica is killed
// with SIGKILL, PostgreSQL is restarted with an immediate shutdown, or a
// client retries every call at random. Each test ends by checking every
// address in the database against what the clients were told: no address
// held twice, no confirmed lease lost, nothing leaked.
//
// The package has no code of its own; its tests run with `go test` (and
// `make test`) like any other.
package faulttest
