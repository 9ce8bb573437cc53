// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"path/filepath"
	"sync/atomic"
	"time"

	"github.com/ipam-dev/ipam/api/ipamclient"
)

// The floor phase runs the mixed run's clients, unchanged, against a
// server in this process that answers both calls from memory: the same
// requests and answers over the same mutual-TLS connections, with no
// database and no allocation behind them. Its CPU per operation (clients
// and that server together, both in this process) is what the HTTP, TLS
// and JSON of the mix cost on this machine before the service does any
// work, the part of the service's own figures that no change to the
// service can remove. It needs no database, so it says nothing of
// PostgreSQL and has no ceiling ratio.

// floorResult is the floor phase's run.
type floorResult struct {
	Clients   int     `json:"clients"`
	Nodes     int     `json:"nodes"`
	DelayMS   float64 `json:"delayMs"` // before each answer
	OpsPerSec float64 `json:"opsPerSec"`
	Errors    int64   `json:"errors"`
	// CPUPerOpUS is the CPU of this process (the clients and the
	// in-memory server) per operation, in microseconds.
	CPUPerOpUS float64 `json:"cpuPerOpUS"`
	// Busy is the machine's busy share of all its CPUs' time.
	Busy float64 `json:"busy"`
}

// floorServer answers POST /v1/nodes/{node}/leases with one made-up
// address (each a new one), DELETE /v1/nodes/{node}/attachments/... with
// 204 and GET /v1/nodes/{node}/blocks (the warm-up's call) with no block, after checking the client's certificate and decoding the
// request as the service would refuse a bad one.
type floorServer struct {
	next  atomic.Uint32
	delay time.Duration // before each answer
}

func (f *floorServer) routes() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/nodes/{node}/leases", func(w http.ResponseWriter, r *http.Request) {
		var req ipamclient.LeaseRequest
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 64<<10))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil || req.ContainerID == "" {
			http.Error(w, "bad lease request", http.StatusBadRequest)
			return
		}
		time.Sleep(f.delay)
		n := f.next.Add(1)
		addr := netip.AddrFrom4([4]byte{10, byte(n >> 16), byte(n >> 8), byte(n)})
		block := netip.PrefixFrom(addr, 26).Masked()
		gw := block.Addr().Next().String()
		gen := int64(n)
		expires := time.Now().Add(time.Hour)
		a := ipamclient.Allocation{
			Addresses: []ipamclient.LeaseAddress{{Address: netip.PrefixFrom(addr, 26).String(), Block: block.String(),
				Family: ipamclient.Ipv4, Gateway: &gw, Generation: &gen, Pool: "default"}},
			ContainerID: req.ContainerID, Interface: req.Interface, Node: r.PathValue("node"),
			Generation: gen, ExpiresAt: &expires,
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		_ = json.NewEncoder(w).Encode(a)
	})
	mux.HandleFunc("GET /v1/nodes/{node}/blocks", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(ipamclient.BlockList{Items: []ipamclient.Block{}})
	})
	mux.HandleFunc("DELETE /v1/nodes/{node}/attachments/{container}/{iface}", func(w http.ResponseWriter, r *http.Request) {
		time.Sleep(f.delay)
		w.WriteHeader(http.StatusNoContent)
	})
	return mux
}

// startFloorServer serves the floor, each answer after delay, on a free port of 127.0.0.1 with the
// benchmark's server certificate, asking every client for a certificate
// of the benchmark's CA; stop closes it.
func startFloorServer(p *benchPKI, delay time.Duration) (url string, stop func(), err error) {
	cert, err := tls.LoadX509KeyPair(filepath.Join(p.dir, "server.crt"), filepath.Join(p.dir, "server.key"))
	if err != nil {
		return "", nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{
		Handler:           (&floorServer{delay: delay}).routes(),
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       120 * time.Second,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{cert}, ClientCAs: p.roots, // the benchmark's CA, as the service's --client-ca-file
			ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12},
	}
	go func() { _ = srv.ServeTLS(ln, "", "") }()
	return "https://" + ln.Addr().String(), func() { _ = srv.Close() }, nil
}

// floorPhase runs clients over nodes (as the mixed run does) against the
// in-memory server for d, after a warm-up and a prefill of perNode
// addresses per node, and prints the result. The server answers after
// delay, the service's median latency in the same run: an idle connection
// costs its wake-ups, so the floor of a mix answered at once would be
// lower than that of the mix the service answers.
func (b *bench) floorPhase(ctx context.Context, clients int, nodes []string, perNode int, d, delay time.Duration) (*floorResult, error) {
	url, stop, err := startFloorServer(b.pki, delay)
	if err != nil {
		return nil, fmt.Errorf("floor server: %w", err)
	}
	defer stop()
	f := &fleet{pki: b.pki, servers: []string{url}, space: b.spaceArg, ledger: newLedger(), perHost: b.cfg.maxConcurrency()}
	ws, err := f.workers(clients, nodes)
	if err != nil {
		return nil, err
	}
	if err = warm(ctx, ws); err == nil {
		err = prefill(ctx, ws, perNode)
	}
	if err != nil {
		return nil, fmt.Errorf("floor warm-up: %w", err)
	}
	before := takeCPUSnapshot(nil, b.db.postmaster())
	r := measure(ctx, ws, d)
	c, ok := cpuSince(before, takeCPUSnapshot(nil, b.db.postmaster()), int(r.Allocs+r.Releases))
	if !ok {
		return nil, errors.New("floor: no CPU figures from /proc")
	}
	fr := &floorResult{Clients: clients, Nodes: len(nodes), DelayMS: ms(delay), OpsPerSec: r.OpsPerSec, Errors: r.Errors, CPUPerOpUS: c.ClientsUS, Busy: c.Busy}
	fmt.Fprintf(b.out, "floor clients=%d nodes=%d delay_ms=%.2f ops/s=%.1f errors=%d cpu of clients and an in-memory server=%.0f µs per op; machine busy %.0f%%\n",
		fr.Clients, fr.Nodes, fr.DelayMS, fr.OpsPerSec, fr.Errors, fr.CPUPerOpUS, 100*fr.Busy)
	if r.Errors > 0 {
		b.failed = append(b.failed, fmt.Sprintf("floor: %d calls failed, e.g. %v", r.Errors, r.ErrorSamples))
	}
	return fr, nil
}
