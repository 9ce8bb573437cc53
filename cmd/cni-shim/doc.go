// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

// Command cni-shim is the CNI IPAM plugin of the IPAM service. Install it
// in the node's CNI bin directory under the type name
//
//	ipam-shim
//
// and name that type in the `ipam` section of a network configuration. The
// main plugin (bridge, ptp, cilium-cni in `ipam: delegated-plugin` mode)
// runs it once per call; it asks the service over HTTPS with a client
// certificate and prints the CNI result.
//
// It speaks CNI 0.3.1, 0.4.0, 1.0.0 and 1.1.0 (CHECK from 0.4.0, GC and
// STATUS from 1.1.0, as the specification says; github.com/containernetworking/cni's
// skel package enforces this and answers code 1 otherwise).
//
// # Configuration
//
// The whole network configuration arrives on stdin. Its `ipam` section:
//
//	{
//	  "type": "ipam-shim",
//	  "server": "https://ipam.example:8443",  // required; http:// only for local development
//	  "caFile": "/etc/ipam/pki/ca.crt",      // https: CA bundle; empty means the system roots
//	  "certFile": "/etc/ipam/pki/node.crt",  // https: required, the node's client certificate
//	  "keyFile": "/etc/ipam/pki/node.key",   // https: required, its key
//	  "sessionCacheFile": "/run/ipam.sess",  // https: TLS session file; default ipam-shim.sessions next to keyFile, "" off
//	  "pool": "default",                     // optional: one pool for every family
//	  "pools": {"ipv4": "v4", "ipv6": "v6"}, // optional: a pool per family; wins over "pool"
//	  "families": ["ipv4", "ipv6"],          // optional; default every family a pool serves
//	  "routes": [{"dst": "10.96.0.0/12"}],    // optional extra routes, passed through
//	  "defaultRoute": true,                   // default true: 0.0.0.0/0 and ::/0 via each family's gateway
//	  "timeout": "10s",                       // whole-call deadline, 100ms to 5m
//	  "node": "worker-1",                     // default: the host name, lower-cased
//	  "space": "default",                     // optional address space
//	  "reserve": 4,                           // addresses leased to the node in advance, 0 to 64; 0: none
//	  "dataDir": "/var/lib/cni/ipam-shim/NAME", // the reserve's node-local file; default per network name
//	  "syncLinger": "2s"                      // how long the reserve's background sync waits for more work, 0s to 1m
//	}
//
// Unknown keys in the `ipam` section are rejected with code 2 (a misspelt
// key would otherwise be silently ignored). With an http:// server the TLS keys must
// be absent. The `dns` section of the network configuration is passed
// through to the result. Outgoing requests never use a proxy from the
// environment: the node talks to the service directly.
//
// Each call is a process of its own, so each would make a full TLS
// handshake. The shim keeps the service's TLS session tickets in
// `sessionCacheFile` (mode 0600: they hold resumption secrets, as keyFile
// holds the key), and the next process resumes the session: one round trip
// and the certificate verification less. Entries are kept per client
// certificate and CA bundle, so another certificate never resumes a session
// made with this one. Processes replace the file atomically; an unreadable,
// corrupt or unwritable file only costs a full handshake. A service of
// several replicas resumes only on the replica that issued the ticket.
//
// # Owner
//
// Each lease records its owner. It comes from CNI_ARGS (K8S_POD_NAMESPACE,
// K8S_POD_NAME, K8S_POD_UID, as the kubelet's runtimes set them), or, for
// keys CNI_ARGS lacks, from the configuration's `args.cni` section; other
// keys are ignored. The service requires a namespace and a name that are
// DNS labels, so when the runtime gives none (cnitool, plain containers) the
// namespace is "cni" and the name is the container ID, lower-cased, with
// every character other than a-z, 0-9 replaced by '-', cut to 63
// characters.
//
// # Verbs
//
// ADD leases one address per family, active at once (expire=false), in one
// request: the shim cannot learn when the main plugin that called it is
// done, so a pending lease confirmed by a second request would cost a round
// trip and protect nothing. A main plugin that fails after IPAM ADD is
// covered by the runtime's DEL, a node that dies by GC. A retry of ADD for
// the same container and interface gets the same addresses; one that finds
// a pending lease (of an older shim that died before confirming it)
// confirms it with its generation. The result has one
// entry in `ips` per address (the address with its block's prefix length
// and the block's gateway), a default route per family via the gateway
// unless defaultRoute is false, the configured routes, and `dns`.
//
// DEL releases the attachment. It succeeds when nothing is held, when
// prevResult is missing, when repeated, and when the service does not know
// the node or space. A DEL that cannot reach the service is recorded in the
// reserve file and replayed (see below); with "reserve": 0 it fails with
// code 11, as claiming success would leak the address until the next GC.
//
// CHECK needs prevResult and succeeds when the addresses in it are exactly
// the ones the service holds for this container and interface.
//
// Every lease records the network configuration's `name` as its network:
// the service keys an attachment by (network, container ID, interface), as
// the CNI specification does, so each network's DEL and CHECK see its own
// attachments only.
//
// GC sends the attachments of `cni.dev/valid-attachments` (or the legacy
// `cni.dev/attachments`) to the service's reconcile endpoint for this node
// and network: every other lease of this network on the node is released,
// and other networks' leases are kept (the runtime lists one network's
// attachments per GC, as host-local keeps a store per network). Without
// either key GC does nothing. The service keeps leases younger than its
// --reconcile-min-age (an ADD may race with the runtime's list); when it
// kept some, GC says how many on stderr, which the runtime logs, since a GC
// soon after Pods went away otherwise releases nothing without a word.
// Leases made by a shim older than this (without a network) are in the
// unnamed network, which the shim's GC and DEL no longer reach: reconcile
// them once through the API without a network, listing the node's live
// attachments.
//
// # Reserve
//
// Pod starts survive an outage of the service, as Cilium's agent allocates
// from its node's CIDR without the operator: each node keeps a reserve of
// `reserve` address sets (one address per family each) leased to it in
// advance. Each slot is an ordinary active lease of the service, of the
// attachment (this network, "ipam-shim-reserve-N", "reserve") owned by
// cni-reserve/NAME, so the service never gives its addresses to anyone
// else. The node-local file `dataDir`/reserve.json, written under an
// flock of `dataDir`/lock and replaced whole by rename, records each
// slot's addresses and generation.
//
// When the configuration names the pool of every family it leases (`pool`,
// or `pools` for each family) and a slot leased for that is free, ADD
// takes the slot and records the Pod on it without asking the service
// (the fast path; a retry gets the same slot), and DEL only records
// itself. A sync then runs in the background (the binary again, detached,
// holding `dataDir`/sync.lock, logging to `dataDir`/sync.log): it sends
// the recorded DELs, hands each taken slot over to its Pod (the service's
// fromReserve: same addresses, the Pod's attachment and owner, recorded in
// the address history as handed-over and from-reserve), releases the
// slots of Pods that stopped before their handover (after handing them
// over, so the history sees every Pod), and refills the reserve. Without
// a free slot, or without named pools, ADD asks the service as before.
//
// When the service is unreachable or unavailable (what would be code 11),
// ADD takes a free slot too, whatever the configuration; DEL records
// itself, and a stopped Pod's slot is not given to another Pod (its
// addresses cool down at the service first). The next call that reaches
// the service (any verb; the runtime's STATUS poll is usually first) sends
// what was recorded the same way. GC includes the
// slots in its valid list, so a reconcile never releases them; slots
// beyond a smaller `reserve` are released. The reserve's addresses come
// from the pools this configuration names (or the service's default), not
// from Pod annotations or selectors. Losing the file while a slot serves a
// Pod loses that record: keep `dataDir` on persistent storage.
//
// STATUS succeeds when an ADD of this configuration could get an address
// now, as CNI 1.1 asks: for each family ADD would lease (`families`, else
// every family of the pool), the pool it would use (`pools`, then `pool`,
// then the service's default pool; STATUS knows no Pod, so a Pod's
// annotations or a pool's selectors are not considered) has a free address
// in one of this node's blocks, or a block it can carve for the node. It
// reads the service's node-usage view of those pools
// (GET /v1/nodes/NODE/pools?pool=...&defaultPool=true), which a node's
// certificate may read for its own node. A STATUS error marks the node's
// network not ready in containerd, which takes the node out of scheduling,
// so code 50 ("plugin not available", CNI's code for "cannot service ADD";
// 51 would add that existing containers lose connectivity, which an IPAM
// plugin never causes) is kept for what holds until an operator acts: the
// pool cannot serve the node (exhausted, disabled, a full cluster-pool node
// range, a family it lacks), a pool the configuration names does not exist,
// or the service rejects this node's certificate or its certificate does
// not verify against caFile. An unreachable or unavailable service is
// usually brief and answers code 11, which the runtime polls again; while
// the reserve has a free slot it answers success instead (ADDs work).
//
// # Error codes
//
// Errors are printed as the CNI error object on stdout and the process
// exits 1.
//
//	 1  incompatible CNI version (skel)
//	 2  unsupported field: a key of the ipam section the shim does not know
//	 4  missing or invalid environment: CNI_COMMAND, CNI_CONTAINERID, CNI_IFNAME, CNI_PATH (skel)
//	 6  stdin is not JSON (skel)
//	 7  invalid network configuration; the message names the field
//	11  try again later: the service is unreachable, timed out, or answered 429, 502, 503 or 504,
//	    and the reserve cannot serve (disabled, or no free slot for ADD)
//	50  STATUS only: no ADD can be served (the pool cannot give this node an address, a pool named
//	    does not exist) or the service rejects this node's TLS credentials
//	100 other service error (the message carries the service's detail)
//	101 pool exhausted (urn:ipam:problem:pool-exhausted), or the node holds the pool's maxBlocksPerNode blocks (urn:ipam:problem:node-block-limit)
//	102 not found: unknown pool, node or space on ADD; no lease on CHECK
//	103 lease conflict: the attachment is held by another owner, pool or families
//	104 forbidden: the service refuses this node's request (HTTP 403)
//	105 the service rejected the request as invalid (e.g. an owner that is not a DNS label)
//	106 TLS failure: the service's certificate does not verify, or it rejects ours
//	107 CHECK: prevResult's addresses differ from the ones the service holds
//	108 no single pool: two pools match the Pod, or none while it requires a match (urn:ipam:problem:pool-match)
//	999 internal error of the shim
package main
