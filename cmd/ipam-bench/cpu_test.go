// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"os"
	"strings"
	"testing"
	"time"
)

func TestParseProcStat(t *testing.T) {
	// A real line of a PostgreSQL backend whose title has spaces and
	// parentheses, cut after the fields read.
	line := "4240 (postgres) S 3904 3904 3904 0 -1 4194560 2112 0 0 0 1234 567 89 10 20 0 1 0 90813 229572608"
	p, err := parseProcStat([]byte(line))
	if err != nil {
		t.Fatal(err)
	}
	if p.PID != 4240 || p.PPID != 3904 || p.Comm != "postgres" || p.Own != (1234+567)*10*time.Millisecond || p.Children != (89+10)*10*time.Millisecond {
		t.Fatalf("parsed %+v", p)
	}
	p, err = parseProcStat([]byte("7 (a (b) c) R 1 1 1 0 -1 0 0 0 0 0 5 6 7 8 20 0 1 0 1 1"))
	if err != nil || p.Comm != "a (b) c" || p.Own != 110*time.Millisecond || p.Children != 150*time.Millisecond {
		t.Fatalf("a name with parentheses: %+v, %v", p, err)
	}
	for _, bad := range []string{"", "12 postgres S 1", "1 (x) S 1 2 3", "1 (x) S 1 1 1 0 -1 0 0 0 0 0 x 6 7 8 20", "1 (x) S y 1 1 0 -1 0 0 0 0 0 5 6 7 8 20"} {
		if _, err := parseProcStat([]byte(bad)); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

// TestPostgresCPU: with the private cluster's postmaster, its time and
// its children's count, and another cluster's processes on the machine
// (whose exits made the figure negative) do not; without one, every
// process named postgres does.
func TestPostgresCPU(t *testing.T) {
	ms := time.Millisecond
	procs := []procCPU{
		{PID: 100, PPID: 1, Comm: "postgres", Own: 10 * ms, Children: 500 * ms},  // ours, with exited backends
		{PID: 101, PPID: 100, Comm: "postgres", Own: 30 * ms},                    // a backend of ours
		{PID: 102, PPID: 100, Comm: "postgres", Own: 5 * ms, Children: 1 * ms},   // a worker of ours
		{PID: 200, PPID: 1, Comm: "postgres", Own: 900 * ms, Children: 900 * ms}, // a neighbour's
		{PID: 201, PPID: 200, Comm: "postgres", Own: 70 * ms},                    // its backend
		{PID: 300, PPID: 1, Comm: "ipam-server", Own: 40 * ms},
	}
	if got := postgresCPU(procs, 100); got != 546*ms {
		t.Fatalf("the private cluster's CPU: %v, want 546ms", got)
	}
	if got := postgresCPU(procs, 0); got != 2416*ms {
		t.Fatalf("every postgres: %v, want 2.416s", got)
	}
}

func TestParseMachineBusy(t *testing.T) {
	busy, total, err := parseMachineBusy(strings.NewReader("cpu  100 10 50 800 40 5 5 0 30 0\ncpu0 1 2 3 4 5 6 7 8 9 10\n"))
	if err != nil {
		t.Fatal(err)
	}
	// Guest time (30) is inside user already; idle and iowait are not busy.
	if busy != 170*10*time.Millisecond || total != 1010*10*time.Millisecond {
		t.Fatalf("busy %v total %v", busy, total)
	}
	if _, _, err := parseMachineBusy(strings.NewReader("intr 1 2 3\n")); err == nil {
		t.Fatal("a first line other than cpu parsed")
	}
}

// TestCPUSince takes two snapshots of this machine around some work of
// this process: the clients' share is the work, and the shares add up.
func TestCPUSince(t *testing.T) {
	if _, err := os.Stat("/proc/self/stat"); err != nil {
		t.Fatal("no /proc: the benchmark reads every figure from it")
	}
	a := takeCPUSnapshot([]int{os.Getpid()}, 0)
	deadline := time.Now().Add(200 * time.Millisecond)
	for n := 0; time.Now().Before(deadline); n++ {
		_ = strings.Repeat("x", n%512)
	}
	b := takeCPUSnapshot([]int{os.Getpid()}, 0)
	c, ok := cpuSince(a, b, 10)
	if !ok {
		t.Fatalf("no figures: %v %v", a.err, b.err)
	}
	if c.ClientsUS <= 0 || c.ServersUS <= 0 || c.Busy <= 0 || c.Busy > 1 {
		t.Fatalf("figures %+v", c)
	}
	if _, ok := cpuSince(a, b, 0); ok {
		t.Fatal("figures over no operation")
	}
	if _, ok := cpuSince(b, a, 10); ok {
		t.Fatal("figures over a negative interval")
	}
}
