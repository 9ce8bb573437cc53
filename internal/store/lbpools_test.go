// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ipam-dev/ipam/internal/alloc"
)

// lbSpec builds a VIP pool spec of blocks written as CIDRs or start-stop.
func lbSpec(blocks ...string) alloc.LBPoolSpec {
	var s alloc.LBPoolSpec
	for _, b := range blocks {
		if from, to, ok := strings.Cut(b, "-"); ok {
			s.Blocks = append(s.Blocks, alloc.LBBlock{Start: netip.MustParseAddr(from), Stop: netip.MustParseAddr(to)})
		} else {
			s.Blocks = append(s.Blocks, alloc.LBBlock{CIDR: netip.MustParsePrefix(b)})
		}
	}
	return s
}

func (f *fixture) lbPool(name string, spec alloc.LBPoolSpec) alloc.LBPool {
	f.t.Helper()
	p, err := f.s.CreateLBPool(f.ctx, alloc.LBPool{Space: alloc.DefaultSpace, Name: name, Spec: spec})
	if err != nil {
		f.t.Fatal(err)
	}
	return p
}

// texts answers the one text column of the rows of sql.
func (f *fixture) texts(sql string) []string {
	f.t.Helper()
	rows, err := f.s.db.Query(f.ctx, sql)
	if err != nil {
		f.t.Fatal(err)
	}
	out, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		f.t.Fatal(err)
	}
	return out
}

func (f *fixture) lbConflict(name string) string {
	f.t.Helper()
	p, err := f.s.GetLBPool(f.ctx, alloc.DefaultSpace, name)
	if err != nil {
		f.t.Fatal(err)
	}
	return p.Status.Conflict
}

// TestLBPoolLab4: the seed's Lab 4 for pools: a start/stop block and a
// selector, counts; a second pool overlapping the first is marked
// conflicting and names the first; deleting the first lifts the mark, and
// the history records both changes.
func TestLBPoolLab4(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	spec := lbSpec("10.0.10.0/24", "10.0.20.100-10.0.20.200")
	spec.ServiceSelector = &metav1.LabelSelector{MatchLabels: map[string]string{"color": "blue"}}
	spec.ReserveFirstLast = true
	blue := f.lbPool("blue", spec)
	if blue.Status.Conflicting() || blue.Status.Families[alloc.IPv4].Total != 254+101 || len(blue.Status.Families) != 1 {
		t.Fatalf("blue: %+v", blue.Status)
	}
	got, err := f.s.GetLBPool(f.ctx, alloc.DefaultSpace, "blue")
	if err != nil || got.Spec.Blocks[1].String() != "10.0.20.100-10.0.20.200" || got.Spec.ServiceSelector.MatchLabels["color"] != "blue" ||
		!got.Spec.ReserveFirstLast || !got.CreatedAt.Equal(blue.CreatedAt) {
		t.Fatalf("read back: %+v %v", got, err)
	}
	f.clock.Advance(1e9)
	red := f.lbPool("red", lbSpec("10.0.20.150-10.0.20.160", "fd00:10::/120"))
	want := `block 10.0.20.150-10.0.20.160 overlaps block 10.0.20.100-10.0.20.200 of pool "blue"`
	if red.Status.Conflict != want || red.Status.Families[alloc.IPv6].Total != 256 {
		t.Fatalf("red: %+v", red.Status)
	}
	if n := f.count(`SELECT count(*) FROM address_ranges r JOIN lb_pools p ON p.id = r.lb_pool_id WHERE p.name = 'red' AND r.conflicting`); n != 2 {
		t.Fatalf("%d conflicting ranges of red", n)
	}
	f.clock.Advance(1e9)
	if _, err := f.s.DeleteLBPool(f.ctx, alloc.DefaultSpace, "blue"); err != nil {
		t.Fatal(err)
	}
	if c := f.lbConflict("red"); c != "" {
		t.Fatalf("red still marked: %q", c)
	}
	kinds := f.texts(`SELECT kind || ' ' || pool || ' ' || reason FROM address_events WHERE kind LIKE 'lbpool-%' ORDER BY id`)
	if strings.Join(kinds, "|") != "lbpool-create blue |lbpool-create red |lbpool-delete blue |lbpool-update red conflict resolved" {
		t.Fatalf("history: %q", kinds)
	}
	_, err = f.s.GetLBPool(f.ctx, alloc.DefaultSpace, "blue")
	wantKind(t, err, alloc.KindNotFound)
}

// TestLBPoolsAndPodPoolsNeverOverlap: either way round, the refusal names
// the field and the other pool; the database refuses it as well when the
// store's check is bypassed.
func TestLBPoolsAndPodPoolsNeverOverlap(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	f.pool("pods", alloc.PoolSpec{IPv4: fam(24, "10.244.0.0/16"), IPv6: fam(120, "fd00:244::/104"), NodeLocal: alloc.DefaultNodeLocal})
	for i, blocks := range [][]string{{"10.0.10.0/24", "10.244.255.250-10.245.0.5"}, {"fd00:10::/120", "fd00:244::/120"}} {
		_, err := f.s.CreateLBPool(f.ctx, alloc.LBPool{Space: alloc.DefaultSpace, Name: fmt.Sprint("vip", i), Spec: lbSpec(blocks...)})
		if e := wantKind(t, err, alloc.KindOverlap); e.Field != "spec.blocks[1]" || !strings.Contains(e.Detail, `Pod pool "pods"`) {
			t.Fatalf("%v: %+v", blocks, e)
		}
	}
	f.lbPool("vip", lbSpec("10.0.10.0/24", "10.1.0.7-10.1.0.9"))
	_, err := f.s.CreatePool(f.ctx, alloc.Pool{Space: alloc.DefaultSpace, Name: "more", Spec: alloc.PoolSpec{IPv4: fam(28, "10.2.0.0/16", "10.1.0.0/24")}})
	if e := wantKind(t, err, alloc.KindOverlap); e.Field != "spec.ipv4.cidrs[1]" || !strings.Contains(e.Detail, `block 10.1.0.7-10.1.0.9 of VIP pool "vip"`) {
		t.Fatalf("%+v", e)
	}
	_, err = f.s.UpdateLBPool(f.ctx, alloc.DefaultSpace, "vip", nil, lbSpec("10.0.10.0/24", "10.244.3.0/24"))
	if e := wantKind(t, err, alloc.KindOverlap); e.Field != "spec.blocks[1]" {
		t.Fatalf("%+v", e)
	}
	// Past the store's checks, the exclusion constraints refuse.
	for _, sql := range []string{
		`INSERT INTO pool_cidrs (pool_id, space, family, cidr, mask_size, position, reserved_start, reserved_end)
			SELECT id, space, 4, '10.0.10.128/25', 28, 9, '{}', '{}' FROM pools WHERE name = 'pods'`,
		`INSERT INTO address_ranges (space, kind, first_addr, last_addr, lb_pool_id, position)
			SELECT space, 'vip', '10.244.1.1', '10.244.1.1', id, 9 FROM lb_pools WHERE name = 'vip'`,
		`INSERT INTO address_ranges (space, kind, first_addr, last_addr, lb_pool_id, position)
			SELECT space, 'vip', '10.0.10.7', '10.0.10.8', id, 9 FROM lb_pools WHERE name = 'vip'`,
	} {
		if _, err := f.s.db.Exec(f.ctx, sql); err == nil || !strings.Contains(err.Error(), "exclusion constraint") {
			t.Errorf("%s: %v", sql, err)
		}
	}
	// A marked pool's rows may overlap; the others may not.
	f.lbPool("late", lbSpec("10.0.10.0/25"))
	if _, err := f.s.db.Exec(f.ctx, `UPDATE address_ranges SET conflicting = false
		WHERE lb_pool_id = (SELECT id FROM lb_pools WHERE name = 'late')`); err == nil || !strings.Contains(err.Error(), "address_ranges_vip") {
		t.Errorf("unmarking an overlapping pool: %v", err)
	}
	// Ranges of a deleted Pod pool CIDR go with it.
	if _, err := f.s.DeletePool(f.ctx, alloc.DefaultSpace, "pods"); err != nil {
		t.Fatal(err)
	}
	if n := f.count(`SELECT count(*) FROM address_ranges WHERE kind = 'pod'`); n != 0 {
		t.Fatalf("%d Pod ranges left", n)
	}
	f.lbPool("where-pods-were", lbSpec("10.244.0.0/24"))
}

// TestLBPoolWrites: idempotent create, conflict on another spec, dry runs
// write nothing, updates settle every pool's mark, a missing space or pool
// is named, and a space with VIP pools is not deleted.
func TestLBPoolWrites(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	a := f.lbPool("a", lbSpec("10.0.10.0/24"))
	f.clock.Advance(1e9)
	if again := f.lbPool("a", lbSpec("10.0.10.0/24")); !again.CreatedAt.Equal(a.CreatedAt) {
		t.Fatalf("retry answered another pool: %+v", again)
	}
	_, err := f.s.CreateLBPool(f.ctx, alloc.LBPool{Space: alloc.DefaultSpace, Name: "a", Spec: lbSpec("10.0.11.0/24")})
	if e := wantKind(t, err, alloc.KindConflict); e.Field != "name" {
		t.Fatalf("%+v", e)
	}
	dry, err := f.s.CreateLBPool(f.ctx, alloc.LBPool{Space: alloc.DefaultSpace, Name: "b", Spec: lbSpec("10.0.10.128/25")}, alloc.DryRun(true))
	if err != nil || !dry.Status.Conflicting() {
		t.Fatalf("dry run: %+v %v", dry, err)
	}
	if n := f.count(`SELECT count(*) FROM lb_pools WHERE name = 'b'`); n != 0 {
		t.Fatal("a dry run wrote")
	}
	f.lbPool("b", lbSpec("10.0.10.128/25"))
	f.lbPool("c", lbSpec("10.0.12.0/24"))
	// a moves off b's block and onto c's: b is lifted, c (newer) marked.
	if _, err := f.s.UpdateLBPool(f.ctx, alloc.DefaultSpace, "a", map[string]string{"team": "net"}, lbSpec("10.0.12.0/26")); err != nil {
		t.Fatal(err)
	}
	if ca, cb, cc := f.lbConflict("a"), f.lbConflict("b"), f.lbConflict("c"); ca != "" || cb != "" || !strings.Contains(cc, `of pool "a"`) {
		t.Fatalf("after the edit: a %q, b %q, c %q", ca, cb, cc)
	}
	// An edit of the marked pool keeps its mark while it overlaps, and
	// lifts it once off the overlap.
	got, err := f.s.UpdateLBPool(f.ctx, alloc.DefaultSpace, "c", nil, lbSpec("10.0.12.60-10.0.12.70"))
	if err != nil || !got.Status.Conflicting() {
		t.Fatalf("c overlaps a still: %+v", got.Status)
	}
	got, err = f.s.UpdateLBPool(f.ctx, alloc.DefaultSpace, "c", nil, lbSpec("10.0.13.0/24"))
	if err != nil || got.Status.Conflicting() {
		t.Fatalf("c: %+v %v", got.Status, err)
	}
	_, err = f.s.UpdateLBPool(f.ctx, alloc.DefaultSpace, "nope", nil, lbSpec("10.0.14.0/24"))
	if e := wantKind(t, err, alloc.KindNotFound); e.Field != "pool" {
		t.Fatalf("%+v", e)
	}
	_, err = f.s.CreateLBPool(f.ctx, alloc.LBPool{Space: "nope", Name: "x", Spec: lbSpec("10.0.14.0/24")})
	if e := wantKind(t, err, alloc.KindNotFound); e.Field != "space" {
		t.Fatalf("%+v", e)
	}
	_, err = f.s.CreateLBPool(f.ctx, alloc.LBPool{Space: alloc.DefaultSpace, Name: "x", Spec: lbSpec()})
	if e := wantKind(t, err, alloc.KindInvalid); e.Field != "spec.blocks" {
		t.Fatalf("%+v", e)
	}
	if _, err := f.s.CreateSpace(f.ctx, "other"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.s.CreateLBPool(f.ctx, alloc.LBPool{Space: "other", Name: "a", Spec: lbSpec("10.0.10.0/24")}); err != nil {
		t.Fatalf("another space is independent: %v", err)
	}
	wantKind(t, f.s.DeleteSpace(f.ctx, "other"), alloc.KindInUse)
	list, next, err := f.s.ListLBPools(f.ctx, alloc.DefaultSpace, alloc.Page{Limit: 2})
	if err != nil || len(list) != 2 || list[0].Name != "a" || next == "" {
		t.Fatalf("list: %v %q %v", list, next, err)
	}
	list, next, err = f.s.ListLBPools(f.ctx, alloc.DefaultSpace, alloc.Page{Limit: 2, Continue: next})
	if err != nil || len(list) != 1 || list[0].Name != "c" || next != "" {
		t.Fatalf("page 2: %v %q %v", list, next, err)
	}
}

// TestLBPoolsConcurrentOverlap: writers of overlapping pools at once end
// with the unmarked pools pairwise apart, whatever the order.
func TestLBPoolsConcurrentOverlap(t *testing.T) {
	t.Parallel()
	f := newFixture(t, nil)
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	for i := range 16 {
		wg.Go(func() {
			_, err := f.s.CreateLBPool(f.ctx, alloc.LBPool{Space: alloc.DefaultSpace, Name: fmt.Sprint("p", i),
				Spec: lbSpec(fmt.Sprintf("10.0.%d.0/24", i/2), fmt.Sprintf("10.1.0.%d-10.1.0.%d", i*4, i*4+5))})
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if n := f.count(`SELECT count(*) FROM address_ranges a JOIN address_ranges b ON a.id < b.id AND a.span && b.span
		WHERE a.kind = 'vip' AND b.kind = 'vip' AND NOT a.conflicting AND NOT b.conflicting`); n != 0 {
		t.Fatalf("%d overlapping unmarked pairs", n)
	}
	if n := f.count(`SELECT count(*) FROM lb_pools WHERE conflict IS NULL`); n == 0 || n == 16 {
		t.Fatalf("%d unmarked pools of 16 overlapping", n)
	}
}
