// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package store

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
)

// serverCPU reads the CPU time of a PostgreSQL server that runs on this
// machine: its postmaster's, its reaped children's (which the kernel adds
// to the postmaster's) and its live children's. Benchmarks report it per
// operation: on a shared machine, other work changes the time per
// operation much more than the database's CPU per operation.
type serverCPU struct {
	postmaster int // 0: the server is not on this machine, or there is no /proc
}

// serverCPUOf finds the postmaster of db's server through one of its
// backends.
func serverCPUOf(ctx context.Context, db *pgxpool.Pool) (serverCPU, error) {
	var backend int
	if err := db.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&backend); err != nil {
		return serverCPU{}, err
	}
	// The pid names a local process only if the server is local: a remote
	// backend's pid may be anything here, so both must be postgres.
	st, ok := readProcStat(backend)
	if !ok || st.comm != "postgres" {
		return serverCPU{}, nil
	}
	if pm, ok := readProcStat(st.ppid); !ok || pm.comm != "postgres" {
		return serverCPU{}, nil
	}
	return serverCPU{postmaster: st.ppid}, nil
}

// used is the server's CPU time so far; false when it cannot be read.
func (c serverCPU) used() (time.Duration, bool) {
	if c.postmaster == 0 {
		return 0, false
	}
	pm, ok := readProcStat(c.postmaster)
	if !ok {
		return 0, false
	}
	ticks := pm.self + pm.children
	procs, _ := filepath.Glob("/proc/[0-9]*")
	for _, p := range procs {
		pid, err := strconv.Atoi(filepath.Base(p))
		if err != nil {
			continue
		}
		if st, ok := readProcStat(pid); ok && st.ppid == c.postmaster {
			ticks += st.self + st.children
		}
	}
	// /proc counts in USER_HZ, which Linux fixes at 100 for user space.
	return time.Duration(ticks) * 10 * time.Millisecond, true
}

// cpuMark is the server's CPU time at the start of a measurement.
type cpuMark struct {
	c  serverCPU
	at time.Duration
	ok bool
}

// start marks the beginning of a measurement; report ends it.
func (c serverCPU) start() cpuMark {
	at, ok := c.used()
	return cpuMark{c: c, at: at, ok: ok}
}

// report reports the server's CPU time since m per operation of b, as
// pg-cpu-µs/op, when it could be read.
func (m cpuMark) report(b *testing.B) {
	now, ok := m.c.used()
	if m.ok && ok && b.N > 0 {
		b.ReportMetric(float64(now-m.at)/float64(time.Microsecond)/float64(b.N), "pg-cpu-µs/op")
	}
}

// procStat is what serverCPU reads of /proc/PID/stat.
type procStat struct {
	comm           string
	ppid           int
	self, children int64 // utime+stime, cutime+cstime, in clock ticks
}

func readProcStat(pid int) (procStat, bool) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procStat{}, false
	}
	return parseProcStat(string(b))
}

// parseProcStat reads a /proc/PID/stat line: "pid (comm) state ppid ...",
// where comm may hold spaces and parentheses, so the fields are counted
// from the last ')'.
func parseProcStat(s string) (procStat, bool) {
	open, end := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || end < open {
		return procStat{}, false
	}
	f := strings.Fields(s[end+1:])
	if len(f) < 15 {
		return procStat{}, false
	}
	st := procStat{comm: s[open+1 : end]}
	var n [5]int64
	for i, field := range []int{1, 11, 12, 13, 14} { // ppid, utime, stime, cutime, cstime
		v, err := strconv.ParseInt(f[field], 10, 64)
		if err != nil {
			return procStat{}, false
		}
		n[i] = v
	}
	st.ppid, st.self, st.children = int(n[0]), n[1]+n[2], n[3]+n[4]
	return st, true
}

func TestParseProcStat(t *testing.T) {
	line := "4242 (post (gres)) S 17 4242 4242 0 -1 4194560 1000 0 0 0 310 95 12 3 20 0 1 0 500 0 0\n"
	got, ok := parseProcStat(line)
	if want := (procStat{comm: "post (gres)", ppid: 17, self: 405, children: 15}); !ok || got != want {
		t.Fatalf("parseProcStat = %+v, %v; want %+v", got, ok, want)
	}
	for _, bad := range []string{"", "4242 (postgres) S 17", "4242 (postgres) S 17 1 1 0 -1 0 0 0 0 0 x 95 12 3 20"} {
		if _, ok := parseProcStat(bad); ok {
			t.Errorf("parseProcStat(%q) accepted", bad)
		}
	}
}
