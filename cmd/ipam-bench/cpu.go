// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// A measured run's throughput is bounded by the CPU of one machine shared
// by the database, the servers and the clients, so each run also reports
// who spent it: CPU time per operation, by process class. Unlike ops/s,
// these figures hardly move when a neighbour steals time, so they show
// what a change to one side bought.

// userHZ is the unit of the CPU times in /proc/PID/stat (USER_HZ, 100 on
// every Linux architecture Go supports).
const userHZ = 100

// procCPU is a process's CPU time from its /proc/PID/stat text: its own
// (utime + stime) and that of its children it waited for (cutime +
// cstime), which is where the time of PostgreSQL's exited backends goes.
type procCPU struct {
	PID, PPID int
	Comm      string
	Own       time.Duration
	Children  time.Duration
}

// parseProcStat reads a /proc/PID/stat line. The command name is between
// the first '(' and the last ')' and may itself hold spaces or parentheses.
func parseProcStat(line []byte) (procCPU, error) {
	open, end := bytes.IndexByte(line, '('), bytes.LastIndexByte(line, ')')
	if open < 0 || end < open {
		return procCPU{}, fmt.Errorf("no (comm) in %q", line)
	}
	// After ") ": state(3) ppid(4) ... utime(14) stime(15) cutime(16) cstime(17).
	f := strings.Fields(string(line[end+1:]))
	if len(f) < 15 {
		return procCPU{}, fmt.Errorf("%d fields after (comm), want at least 15", len(f))
	}
	var t [4]int64
	for i := range t {
		n, err := strconv.ParseInt(f[11+i], 10, 64)
		if err != nil {
			return procCPU{}, fmt.Errorf("field %d: %w", 14+i, err)
		}
		t[i] = n
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(line[:open])))
	ppid, err := strconv.Atoi(f[1])
	if err != nil {
		return procCPU{}, fmt.Errorf("ppid: %w", err)
	}
	tick := time.Second / userHZ
	return procCPU{PID: pid, PPID: ppid, Comm: string(line[open+1 : end]), Own: time.Duration(t[0]+t[1]) * tick, Children: time.Duration(t[2]+t[3]) * tick}, nil
}

// postgresCPU is the CPU time of the database among procs: with a
// postmaster pid, that process's and its children's (the backends and
// workers; an exited one's time is in the postmaster's cutime), so a
// neighbour's PostgreSQL on a shared machine is not counted, nor its
// processes' exits read as negative time (seen: -10,205 µs per op);
// without one (a -database-url), every process named postgres.
func postgresCPU(procs []procCPU, postmaster int) time.Duration {
	var d time.Duration
	for _, p := range procs {
		if (postmaster > 0 && (p.PID == postmaster || p.PPID == postmaster)) || (postmaster <= 0 && p.Comm == "postgres") {
			d += p.Own + p.Children
		}
	}
	return d
}

func readProcCPU(pid int) (procCPU, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return procCPU{}, err
	}
	return parseProcStat(b)
}

// parseMachineBusy answers the busy and total time of all CPUs from the
// first line of /proc/stat ("cpu  user nice system idle iowait irq softirq
// steal ..."): busy is all but idle and iowait.
func parseMachineBusy(r io.Reader) (busy, total time.Duration, err error) {
	var line [256]byte
	n, _ := io.ReadFull(r, line[:])
	first, _, _ := strings.Cut(string(line[:n]), "\n")
	f := strings.Fields(first)
	if len(f) < 5 || f[0] != "cpu" {
		return 0, 0, fmt.Errorf("first line %q is not the cpu total", first)
	}
	tick := time.Second / userHZ
	for i, s := range f[1:] {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, 0, fmt.Errorf("cpu field %d: %w", i+1, err)
		}
		// guest and guest_nice (fields 9 and 10) are already in user and nice.
		if i >= 8 {
			break
		}
		total += time.Duration(v) * tick
		if i != 3 && i != 4 {
			busy += time.Duration(v) * tick
		}
	}
	return busy, total, nil
}

// cpuSnapshot is the CPU time spent so far by each class of process.
type cpuSnapshot struct {
	at               time.Time
	servers, clients time.Duration
	postgres         time.Duration
	busy, total      time.Duration
	err              error
}

// takeCPUSnapshot reads the servers' pids, this process (the clients) and
// the database's processes (postgresCPU: the private cluster's postmaster
// and its children, or every process named postgres on the machine when
// postmaster is 0; none when the database is remote).
func takeCPUSnapshot(servers []int, postmaster int) cpuSnapshot {
	s := cpuSnapshot{at: time.Now()}
	for _, pid := range servers {
		p, err := readProcCPU(pid)
		if err != nil {
			s.err = err
			return s
		}
		s.servers += p.Own
	}
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		s.err = err
		return s
	}
	s.clients = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	procs := make([]procCPU, 0, len(stats))
	for _, path := range stats {
		b, err := os.ReadFile(path)
		if err != nil {
			continue // exited meanwhile
		}
		if p, err := parseProcStat(b); err == nil {
			procs = append(procs, p)
		}
	}
	s.postgres = postgresCPU(procs, postmaster)
	f, err := os.Open("/proc/stat")
	if err != nil {
		s.err = err
		return s
	}
	defer f.Close()
	s.busy, s.total, s.err = parseMachineBusy(f)
	return s
}

// cpuPerOp is the CPU time per operation of each class over a run, in
// microseconds, and how busy the machine was.
type cpuPerOp struct {
	PostgresUS float64 `json:"postgresUS"`
	ServersUS  float64 `json:"serversUS"`
	ClientsUS  float64 `json:"clientsUS"`
	// OtherUS is the rest of the machine's busy time: the kernel's own
	// threads, and any neighbour.
	OtherUS float64 `json:"otherUS"`
	// Busy is the machine's busy share of all its CPUs' time.
	Busy float64 `json:"busy"`
}

// cpuSince answers the CPU per operation between snapshots a and b, over
// ops operations; false when a snapshot failed or nothing ran.
func cpuSince(a, b cpuSnapshot, ops int) (cpuPerOp, bool) {
	if a.err != nil || b.err != nil || ops <= 0 || b.total <= a.total {
		return cpuPerOp{}, false
	}
	per := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(ops) }
	c := cpuPerOp{
		PostgresUS: per(b.postgres - a.postgres),
		ServersUS:  per(b.servers - a.servers),
		ClientsUS:  per(b.clients - a.clients),
		Busy:       float64(b.busy-a.busy) / float64(b.total-a.total),
	}
	c.OtherUS = max(0, per(b.busy-a.busy)-c.PostgresUS-c.ServersUS-c.ClientsUS)
	return c, true
}

func (c cpuPerOp) String() string {
	return fmt.Sprintf("postgres=%.0f servers=%.0f clients=%.0f other=%.0f (µs per op); machine busy %.0f%%",
		c.PostgresUS, c.ServersUS, c.ClientsUS, c.OtherUS, 100*c.Busy)
}
