// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

// Command etcd is etcd's own server (etcdmain), at the version kubernetes
// v1.37.2 is tested with; Debian's etcd-server is too old for it.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
