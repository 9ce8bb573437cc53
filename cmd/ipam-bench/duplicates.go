// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"cmp"
	"context"
	"fmt"
	"math"
	"net/netip"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
)

// hold is one attachment's holding of an address, on the ledger's clock:
// from the allocation's answer to the release's request. A correct service
// never lets two holds of one address overlap: it commits a lease before
// answering, and frees the address only after the release was asked for.
type hold struct {
	addr        netip.Addr
	node        string
	containerID string
	from, to    time.Duration // to is stillHeld while the attachment holds it
}

// stillHeld ends the hold of an attachment that still holds its address.
const stillHeld = time.Duration(math.MaxInt64)

// overlap is two attachments that held one address at the same time.
type overlap struct {
	Addr   string `json:"addr"`
	First  string `json:"first"`  // node/containerID
	Second string `json:"second"` // node/containerID
}

// findOverlaps answers, for every address, each hold that began before an
// earlier hold of the address had ended. holds is reordered.
func findOverlaps(holds []hold) []overlap {
	slices.SortFunc(holds, func(a, b hold) int {
		return cmp.Or(a.addr.Compare(b.addr), cmp.Compare(a.from, b.from), cmp.Compare(a.to, b.to))
	})
	var out []overlap
	var last hold // the hold of the current address that ends last
	for i, h := range holds {
		if i > 0 && h.addr == last.addr && h.from < last.to {
			out = append(out, overlap{Addr: h.addr.String(), First: last.node + "/" + last.containerID, Second: h.node + "/" + h.containerID})
		}
		if i == 0 || h.addr != last.addr || h.to > last.to {
			last = h
		}
	}
	return out
}

// dbCheck is what the database says at the end of the benchmark.
type dbCheck struct {
	// Duplicates counts addresses of the measured space held (pending or active) by
	// more than one lease row: 0 unless the unique constraint is gone.
	Duplicates int64 `json:"duplicates"`
	// Missing counts attachments the clients hold that the database does
	// not show holding that very address; Unknown counts held leases of
	// the measured nodes no client knows of (a call that failed on the
	// client's side after the server committed it).
	Missing int `json:"missing"`
	Unknown int `json:"unknown"`
	// Counters counts blocks (of the measured and the fill space) whose
	// allocated counter differs from their lease rows.
	Counters int64 `json:"counters"`
}

// checkDatabase compares the database with the clients' open attachments
// (of nodes whose names start with prefix) in spaces[0], and checks the
// block counters of every space.
func checkDatabase(ctx context.Context, dbURL string, spaces []string, prefix string, open []attachment) (dbCheck, error) {
	space := spaces[0]
	var c dbCheck
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return c, err
	}
	defer conn.Close(ctx)
	err = conn.QueryRow(ctx, `SELECT count(*) FROM (SELECT addr FROM leases WHERE space = $1 AND state <> 'released'
		GROUP BY addr HAVING count(*) > 1) d`, space).Scan(&c.Duplicates)
	if err != nil {
		return c, fmt.Errorf("duplicate addresses: %w", err)
	}
	err = conn.QueryRow(ctx, `SELECT count(*) FROM blocks b WHERE b.space = ANY ($1)
		AND b.allocated <> (SELECT count(*) FROM leases l WHERE l.block_id = b.id)`, spaces).Scan(&c.Counters)
	if err != nil {
		return c, fmt.Errorf("block counters: %w", err)
	}
	rows, err := conn.Query(ctx, `SELECT n.name, l.container_id, l.addr FROM leases l JOIN nodes n ON n.id = l.node_id
		WHERE l.space = $1 AND n.name LIKE $2 || '%' AND l.state <> 'released'`, space, prefix)
	if err != nil {
		return c, err
	}
	type key struct{ node, cid string }
	inDB := map[key]netip.Addr{}
	var k key
	var addr netip.Prefix
	_, err = pgx.ForEachRow(rows, []any{&k.node, &k.cid, &addr}, func() error {
		inDB[k] = addr.Addr()
		return nil
	})
	if err != nil {
		return c, fmt.Errorf("held leases: %w", err)
	}
	for _, a := range open {
		k := key{a.node, a.containerID}
		if got, ok := inDB[k]; !ok || got != a.addr {
			c.Missing++
		}
		delete(inDB, k)
	}
	c.Unknown = len(inDB)
	return c, nil
}
