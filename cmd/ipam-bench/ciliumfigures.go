// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"
)

// The cilium phase's figures and checks (cilium.go runs the phase): pure
// functions over what it collected.

// ciliumReport is the cilium phase in the -out file.
type ciliumReport struct {
	// Skipped says why the phase did not run (no kube-apiserver or etcd);
	// every other field is then zero.
	Skipped     string  `json:"skipped,omitempty"`
	Nodes       int     `json:"nodes"`
	PreAllocate int     `json:"preAllocate"`
	QPS         float64 `json:"qps"`
	Burst       int     `json:"burst"`
	Pool        string  `json:"pool"`
	// KubeStartSeconds is etcd's and kube-apiserver's start with the
	// CRDs; LeadSeconds the operator's, from its process start to leading.
	KubeStartSeconds float64 `json:"kubeStartSeconds"`
	LeadSeconds      float64 `json:"leadSeconds"`
	BoundSeconds     float64 `json:"boundSeconds"`
	// CreateErrors counts CiliumNode creates the API server refused.
	CreateErrors int `json:"createErrors"`
	// Reached counts nodes whose pool reached PreAllocate within the
	// bound; PreAllocation is the seconds from a node's create call to the
	// first watch event showing it, over every node seen reaching it
	// before the phase's end (so a max above the bound shows by how much
	// it was missed). Ready is the same to ciliumReadyAddrs addresses
	// (what the agent waits for), ReadyCount how many got there.
	Reached       int          `json:"reached"`
	PreAllocation secondsStats `json:"preAllocationSeconds"`
	ReadyCount    int          `json:"readyCount"`
	Ready         secondsStats `json:"readySeconds"`
	// WatchRestarts says why each watch ended before the phase did; each
	// was followed by a list (whose nodes count at the list's instant).
	WatchRestarts []string     `json:"watchRestarts,omitempty"`
	Requests      kubeRequests `json:"requests"`
	// At the end: addresses in the nodes' pools, nodes with a pool,
	// addresses in more than one node's pool, nodes whose pool differs
	// from the database's leases of the node (with samples), and addresses
	// whose GET /v1/addresses/{a} names another node or pool.
	PoolAddresses     int      `json:"poolAddresses"`
	PoolNodes         int      `json:"poolNodes"`
	Duplicates        int      `json:"duplicates"`
	Mismatches        int      `json:"mismatches"`
	MismatchSamples   []string `json:"mismatchSamples,omitempty"`
	AddressMismatches int      `json:"addressMismatches"`
	// Takeover is the leader's SIGKILL with two replicas or more
	// (takeover.go); nil with one.
	Takeover *takeoverReport `json:"takeover,omitempty"`
	// RSS is each replica's memory over the phase.
	RSS []rssSample `json:"rss"`
}

// secondsStats are percentiles of a duration, in seconds.
type secondsStats struct {
	P50 float64 `json:"p50"`
	P90 float64 `json:"p90"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
}

// secondsOf summarizes ds (sorted in place) in seconds.
func secondsOf(ds []time.Duration) secondsStats {
	l := summarize(ds)
	return secondsStats{P50: l.P50.Seconds(), P90: l.P90.Seconds(), P99: l.P99.Seconds(), Max: l.Max.Seconds()}
}

// kubeRequests are the operator's requests to the API server during the
// phase, from its counter sampled every second.
type kubeRequests struct {
	// Total is every request from the first sample to the last; ByMethod
	// splits it by HTTP method.
	Total    float64            `json:"total"`
	ByMethod map[string]float64 `json:"byMethod"`
	// IdlePerSec is the rate while leading with no node to serve, before
	// the creates.
	IdlePerSec float64 `json:"idlePerSec"`
	// The busy window runs from the creates to the moment every node
	// reached its pre-allocation (or the bound passed).
	BusySeconds  float64 `json:"busySeconds"`
	BusyRequests float64 `json:"busyRequests"`
	// AvgPerSec is BusyRequests / BusySeconds, which a token bucket allows
	// to exceed the QPS by Burst / BusySeconds; SustainedPerSec takes the
	// burst out: (BusyRequests - Burst) / BusySeconds. Ratios are over QPS.
	AvgPerSec       float64 `json:"avgPerSec"`
	AvgRatio        float64 `json:"avgRatio"`
	SustainedPerSec float64 `json:"sustainedPerSec"`
	SustainedRatio  float64 `json:"sustainedRatio"`
	// MaxPerSec is the largest rate over a window of at least a second
	// between two samples; a bucket allows up to Burst + QPS in a second.
	MaxPerSec float64 `json:"maxPerSec"`
	MaxRatio  float64 `json:"maxRatio"`
	// Worst is the window between two samples that comes closest to (or
	// goes over) the bucket's bound; the phase fails when it goes over.
	Worst   bucketWindow    `json:"worst"`
	Samples []counterSample `json:"samples"`
}

// counterSample is the request counter at an instant, seconds after the
// sampling began: Sec is the middle of the scrape's round trip, which ran
// from SentSec to RecvSec (when set; else Sec alone). The counter was read
// somewhere in between: a scrape of a busy server took 9 s at 5,000
// nodes, and the 1,005 requests counted up to its middle went over the
// bucket's bound for that window though they came at 100 a second.
type counterSample struct {
	Sec     float64 `json:"sec"`
	Count   float64 `json:"count"`
	SentSec float64 `json:"sentSec,omitempty"`
	RecvSec float64 `json:"recvSec,omitempty"`
}

// earliest and latest bound the instant the counter was read.
func (c counterSample) earliest() float64 {
	if c.SentSec != 0 || c.RecvSec != 0 {
		return c.SentSec
	}
	return c.Sec
}

func (c counterSample) latest() float64 {
	if c.SentSec != 0 || c.RecvSec != 0 {
		return c.RecvSec
	}
	return c.Sec
}

// bucketWindow is the requests counted between two samples and what a
// token bucket of the client's QPS and burst lets through in that time:
// Burst + QPS x (ToSec - FromSec + slack).
type bucketWindow struct {
	FromSec  float64 `json:"fromSec"`
	ToSec    float64 `json:"toSec"`
	Requests float64 `json:"requests"`
	Allowed  float64 `json:"allowed"`
}

// ok reports whether the window stays within the bucket's bound.
func (w bucketWindow) ok() bool { return w.Requests <= w.Allowed }

// avgRate answers the mean rate over s, from its first sample to its
// last; 0 for fewer than two samples or no time between them.
func avgRate(s []counterSample) float64 {
	if len(s) < 2 {
		return 0
	}
	first, last := s[0], s[len(s)-1]
	if last.Sec <= first.Sec {
		return 0
	}
	return (last.Count - first.Count) / (last.Sec - first.Sec)
}

// maxRate answers the largest rate over a window of at least minWindow
// seconds: from each sample to the first one minWindow or more after it.
// (A shorter window would show a burst's instant rate, which no limit
// bounds.) 0 when no two samples are that far apart.
func maxRate(s []counterSample, minWindow float64) float64 {
	m := 0.0
	for i := range s {
		for j := i + 1; j < len(s); j++ {
			if dt := s[j].Sec - s[i].Sec; dt >= minWindow {
				m = max(m, (s[j].Count-s[i].Count)/dt)
				break
			}
		}
	}
	return m
}

// worstWindow answers, over every pair of samples i < j, the window
// whose count comes closest to, or goes furthest over, what a token
// bucket lets through: burst + qps x (t_j - t_i + slack), slack in
// seconds, t_j - t_i taken at its widest (from the scrape of i sent to
// the answer of j's: each counter was read somewhere in its round trip).
// Closest is the largest Requests / Allowed. With fewer than two samples
// it answers the zero window (ok).
func worstWindow(s []counterSample, qps float64, burst int, slack float64) bucketWindow {
	var worst bucketWindow
	ratio := -1.0
	for i := range s {
		for j := i + 1; j < len(s); j++ {
			w := bucketWindow{FromSec: s[i].Sec, ToSec: s[j].Sec, Requests: s[j].Count - s[i].Count,
				Allowed: float64(burst) + qps*(s[j].latest()-s[i].earliest()+slack)}
			if r := w.Requests / w.Allowed; r > ratio {
				worst, ratio = w, r
			}
		}
	}
	return worst
}

// requestFigures computes the request figures from the samples: idle
// before the busy window, which runs from samples[busyFrom] to
// samples[busyTo].
func requestFigures(samples []counterSample, busyFrom, busyTo int, qps float64, burst int, slack float64) kubeRequests {
	r := kubeRequests{Samples: samples}
	if len(samples) == 0 {
		return r
	}
	r.Total = samples[len(samples)-1].Count - samples[0].Count
	r.IdlePerSec = avgRate(samples[:busyFrom+1])
	busy := samples[busyFrom : busyTo+1]
	if len(busy) >= 2 {
		first, last := busy[0], busy[len(busy)-1]
		r.BusySeconds, r.BusyRequests = last.Sec-first.Sec, last.Count-first.Count
	}
	if r.BusySeconds > 0 {
		r.AvgPerSec = r.BusyRequests / r.BusySeconds
		r.SustainedPerSec = max(0, r.BusyRequests-float64(burst)) / r.BusySeconds
	}
	r.MaxPerSec = maxRate(samples, 1)
	r.AvgRatio, r.SustainedRatio, r.MaxRatio = r.AvgPerSec/qps, r.SustainedPerSec/qps, r.MaxPerSec/qps
	r.Worst = worstWindow(samples, qps, burst, slack)
	return r
}

// metricSeries is one series of a Prometheus text exposition.
type metricSeries struct {
	Labels map[string]string
	Value  float64
}

// parseMetric answers every series of the metric called name in text, a
// Prometheus text exposition (name{label="value",...} value [timestamp]
// per line; label values escape \, " and newline with a backslash).
// Comments and other metrics are skipped; a malformed line of name is an
// error.
func parseMetric(text, name string) ([]metricSeries, error) {
	var out []metricSeries
	for line := range strings.Lines(text) {
		line = strings.TrimSpace(line)
		if line == "" || line[0] == '#' {
			continue
		}
		end := strings.IndexAny(line, "{ \t")
		if end < 0 || line[:end] != name {
			continue
		}
		s := metricSeries{Labels: map[string]string{}}
		rest := line[end:]
		if rest[0] == '{' {
			var err error
			if rest, err = parseLabels(rest[1:], s.Labels); err != nil {
				return nil, fmt.Errorf("metric %s: %w in %q", name, err, line)
			}
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 || len(fields) > 2 {
			return nil, fmt.Errorf("metric %s: want a value (and a timestamp) in %q", name, line)
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			return nil, fmt.Errorf("metric %s: value %q: %w", name, fields[0], err)
		}
		s.Value = v
		out = append(out, s)
	}
	return out, nil
}

// parseLabels reads label="value" pairs up to the closing brace into
// labels and answers what follows the brace.
func parseLabels(s string, labels map[string]string) (string, error) {
	for {
		s = strings.TrimLeft(s, " \t")
		if strings.HasPrefix(s, "}") {
			return s[1:], nil
		}
		eq := strings.IndexByte(s, '=')
		if eq <= 0 || eq+1 >= len(s) || s[eq+1] != '"' {
			return "", errors.New(`want label="value"`)
		}
		key := strings.TrimSpace(s[:eq])
		var val strings.Builder
		i := eq + 2
		for ; i < len(s) && s[i] != '"'; i++ {
			if s[i] == '\\' && i+1 < len(s) {
				i++
				switch s[i] {
				case 'n':
					val.WriteByte('\n')
				default: // \\ and \"
					val.WriteByte(s[i])
				}
				continue
			}
			val.WriteByte(s[i])
		}
		if i >= len(s) {
			return "", errors.New("unterminated label value")
		}
		labels[key] = val.String()
		s = strings.TrimLeft(s[i+1:], " \t")
		if strings.HasPrefix(s, ",") {
			s = s[1:]
		} else if !strings.HasPrefix(s, "}") {
			return "", errors.New("want , or } after a label")
		}
	}
}

// sumSeries answers the sum of the series' values and the sums by the
// value of label.
func sumSeries(ss []metricSeries, label string) (total float64, by map[string]float64) {
	by = map[string]float64{}
	for _, s := range ss {
		total += s.Value
		by[s.Labels[label]] += s.Value
	}
	return total, by
}

// countWithin counts the durations of ds that are at most bound.
func countWithin(ds []time.Duration, bound time.Duration) int {
	n := 0
	for _, d := range ds {
		if d <= bound {
			n++
		}
	}
	return n
}

// failures are the checks the phase failed, one line each: a create the
// API server refused, a node that did not reach its pre-allocation within
// bound, a window with more requests than a token bucket of the operator's
// QPS and burst lets through, an address in two nodes' pools, a pool the
// database disagrees with. None for a skipped phase.
func (r *ciliumReport) failures(bound time.Duration) []string {
	if r.Skipped != "" {
		return nil
	}
	var out []string
	if r.CreateErrors > 0 {
		out = append(out, fmt.Sprintf("cilium: %d of %d CiliumNode creates failed", r.CreateErrors, r.Nodes))
	}
	if r.Reached < r.Nodes {
		out = append(out, fmt.Sprintf("cilium: %d of %d nodes reached %d addresses within %v", r.Reached, r.Nodes, r.PreAllocate, bound))
	}
	if w := r.Requests.Worst; !w.ok() {
		out = append(out, fmt.Sprintf("cilium: %.0f requests to the API server in %.1fs (%.1f-%.1fs), over the %.0f a client of QPS %g and burst %d sends",
			w.Requests, w.ToSec-w.FromSec, w.FromSec, w.ToSec, w.Allowed, r.QPS, r.Burst))
	}
	if r.Duplicates > 0 || r.Mismatches > 0 || r.AddressMismatches > 0 {
		out = append(out, fmt.Sprintf("cilium: %d addresses in two nodes' pools, %d nodes' pools and %d addresses differ from the database",
			r.Duplicates, r.Mismatches, r.AddressMismatches))
	}
	if r.Takeover != nil {
		out = append(out, r.Takeover.failures("cilium")...)
	} else {
		out = append(out, (&takeoverReport{RSS: r.RSS}).failures("cilium")...)
	}
	return out
}

// poolDuplicates answers, sorted, the addresses that are in more than one
// node's pool (node -> its pool's addresses).
func poolDuplicates(pools map[string][]string) []string {
	seen := map[string]int{}
	for _, addrs := range pools {
		for _, a := range addrs {
			seen[a]++
		}
	}
	var dups []string
	for a, n := range seen {
		if n > 1 {
			dups = append(dups, a)
		}
	}
	slices.Sort(dups)
	return dups
}

// poolMismatches compares each node's pool in its CiliumNode with the
// addresses the database holds for it, and answers one line per node
// where they differ, sorted by node. A node missing on one side has no
// addresses there.
func poolMismatches(kube, db map[string][]string) []string {
	nodes := map[string]bool{}
	for n := range kube {
		nodes[n] = true
	}
	for n := range db {
		nodes[n] = true
	}
	var out []string
	for _, n := range slices.Sorted(maps.Keys(nodes)) {
		k, d := slices.Sorted(slices.Values(kube[n])), slices.Sorted(slices.Values(db[n]))
		if !slices.Equal(k, d) {
			out = append(out, fmt.Sprintf("%s: spec.ipam.pool %v, database %v", n, k, d))
		}
	}
	return out
}

// leaseAddr is the address of a lease's address field, which carries its
// block's prefix length (172.16.0.5/26), or of a CiliumNode's pool entry
// (172.16.0.5), in one canonical form.
func leaseAddr(s string) (string, error) {
	if p, err := netip.ParsePrefix(s); err == nil {
		return p.Addr().String(), nil
	}
	a, err := netip.ParseAddr(s)
	if err != nil {
		return "", fmt.Errorf("lease address %q: %w", s, err)
	}
	return a.String(), nil
}
