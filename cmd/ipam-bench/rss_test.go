// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"os"
	"strings"
	"testing"
)

// procStatusSample is part of a real /proc/PID/status of a Go server.
const procStatusSample = `Name:	ipam-server
Umask:	0022
State:	S (sleeping)
Pid:	18098
VmPeak:	 1821352 kB
VmSize:	 1821352 kB
VmLck:	       0 kB
VmHWM:	   52344 kB
VmRSS:	   49528 kB
RssAnon:	   27376 kB
Threads:	9
`

func TestParseProcStatus(t *testing.T) {
	m, err := parseProcStatus(strings.NewReader(procStatusSample))
	if err != nil {
		t.Fatal(err)
	}
	if m.Peak != 52344<<10 || m.RSS != 49528<<10 {
		t.Fatalf("parsed %+v", m)
	}
	if _, err := parseProcStatus(strings.NewReader("Name:\tkthreadd\nState:\tS\n")); err == nil {
		t.Fatal("a status without VmRSS parsed")
	}
	if _, err := parseProcStatus(strings.NewReader("VmHWM:\t12 MB\nVmRSS:\t1 kB\n")); err == nil {
		t.Fatal("a unit other than kB parsed")
	}
}

// TestWatchRSS watches this process: its peak is reset and read back.
func TestWatchRSS(t *testing.T) {
	if _, err := os.Stat("/proc/self/status"); err != nil {
		t.Skip("no /proc")
	}
	w := watchRSS([]int{os.Getpid()})
	s := w.stop()
	if len(s) != 1 || s[0].Error != "" || s[0].PeakMiB <= 0 || s[0].SampledMaxMiB <= 0 || s[0].EndMiB <= 0 {
		t.Fatalf("samples %+v", s)
	}
	if maxPeak(s) < s[0].EndMiB {
		t.Fatalf("maxPeak %v below the end RSS %v", maxPeak(s), s[0].EndMiB)
	}
}
