// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// procMemory is the memory of a process from /proc/PID/status, in bytes.
type procMemory struct {
	RSS  int64 // VmRSS: resident now
	Peak int64 // VmHWM: the resident peak since start or the last reset
}

// parseProcStatus reads VmRSS and VmHWM from a /proc/PID/status text
// ("VmHWM:	   52344 kB"). Both must be present.
func parseProcStatus(r io.Reader) (procMemory, error) {
	var m procMemory
	var haveRSS, havePeak bool
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		key, val, ok := strings.Cut(sc.Text(), ":")
		if !ok || (key != "VmRSS" && key != "VmHWM") {
			continue
		}
		fields := strings.Fields(val)
		if len(fields) != 2 || fields[1] != "kB" {
			return m, fmt.Errorf("%s: unexpected value %q", key, strings.TrimSpace(val))
		}
		kb, err := strconv.ParseInt(fields[0], 10, 64)
		if err != nil {
			return m, fmt.Errorf("%s: %w", key, err)
		}
		if key == "VmRSS" {
			m.RSS, haveRSS = kb<<10, true
		} else {
			m.Peak, havePeak = kb<<10, true
		}
	}
	if err := sc.Err(); err != nil {
		return m, err
	}
	if !haveRSS || !havePeak {
		return m, fmt.Errorf("no VmRSS or VmHWM line (not Linux, or a kernel thread)")
	}
	return m, nil
}

// readProcMemory reads /proc/PID/status.
func readProcMemory(pid int) (procMemory, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return procMemory{}, err
	}
	defer f.Close()
	return parseProcStatus(f)
}

// resetPeakRSS sets the process's VmHWM back to its current RSS (Linux:
// "5" written to /proc/PID/clear_refs), so the peak read at the end of a
// phase is that phase's.
func resetPeakRSS(pid int) error {
	return os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", pid), []byte("5"), 0)
}

// rssSample is one phase's memory of one server process, in MiB.
type rssSample struct {
	// PeakMiB is VmHWM at the end of the phase: the phase's peak when
	// PeakIsPhase, else the peak since the process started.
	PeakMiB     float64 `json:"peakMiB"`
	PeakIsPhase bool    `json:"peakIsPhase"`
	// SampledMaxMiB is the largest VmRSS read during the phase (every
	// rssEvery), EndMiB the VmRSS at its end.
	SampledMaxMiB float64 `json:"sampledMaxMiB"`
	EndMiB        float64 `json:"endMiB"`
	Error         string  `json:"error,omitempty"`
}

// rssEvery is how often VmRSS is sampled during a phase.
const rssEvery = 250 * time.Millisecond

// rssWatch samples the memory of the server processes during one phase.
type rssWatch struct {
	pids    []int
	reset   []bool
	stopc   chan struct{}
	wg      sync.WaitGroup
	mu      sync.Mutex
	sampled []int64
}

// watchRSS resets the peaks of pids and samples their VmRSS until stop.
func watchRSS(pids []int) *rssWatch {
	w := &rssWatch{pids: pids, reset: make([]bool, len(pids)), sampled: make([]int64, len(pids)), stopc: make(chan struct{})}
	for i, pid := range pids {
		w.reset[i] = resetPeakRSS(pid) == nil
	}
	w.wg.Go(func() {
		t := time.NewTicker(rssEvery)
		defer t.Stop()
		for {
			w.sample()
			select {
			case <-w.stopc:
				return
			case <-t.C:
			}
		}
	})
	return w
}

func (w *rssWatch) sample() {
	for i, pid := range w.pids {
		if m, err := readProcMemory(pid); err == nil {
			w.mu.Lock()
			w.sampled[i] = max(w.sampled[i], m.RSS)
			w.mu.Unlock()
		}
	}
}

// stop ends the sampling and answers each process's figures.
func (w *rssWatch) stop() []rssSample {
	close(w.stopc)
	w.wg.Wait()
	w.sample()
	out := make([]rssSample, len(w.pids))
	for i, pid := range w.pids {
		m, err := readProcMemory(pid)
		if err != nil {
			out[i].Error = err.Error()
		}
		out[i].PeakMiB, out[i].PeakIsPhase = mib(m.Peak), w.reset[i]
		out[i].SampledMaxMiB, out[i].EndMiB = mib(max(w.sampled[i], m.RSS)), mib(m.RSS)
	}
	return out
}

// maxPeak answers the largest peak among the processes.
func maxPeak(ss []rssSample) float64 {
	var m float64
	for _, s := range ss {
		m = max(m, s.PeakMiB, s.SampledMaxMiB)
	}
	return m
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }
