// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
	"time"

	ipamtypes "github.com/cilium/cilium/pkg/ipam/types"
	ciliumv2 "github.com/cilium/cilium/pkg/k8s/apis/cilium.io/v2"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ipam-dev/ipam/internal/kubetest"
)

// exposition is /metrics as the server writes it (OpenTelemetry's
// Prometheus exporter): HELP and TYPE lines, labels in any order, other
// metrics whose names start alike.
const exposition = `# HELP ipam_cilium_operator_kube_requests_total Requests the Cilium operator sent to the Kubernetes API server, by method and status code (0: no answer).
# TYPE ipam_cilium_operator_kube_requests_total counter
ipam_cilium_operator_kube_requests_total{code="200",method="GET"} 12
ipam_cilium_operator_kube_requests_total{code="200",method="PUT"} 230
ipam_cilium_operator_kube_requests_total{method="PUT",code="409"} 3
ipam_cilium_operator_kube_requests_total{code="0",method="GET"} 1 1712345678000
ipam_cilium_operator_kube_requests_totalx{code="200",method="GET"} 1000
# HELP ipam_cilium_operator_leader 1 while this replica is the elected Cilium operator, else 0.
# TYPE ipam_cilium_operator_leader gauge
ipam_cilium_operator_leader 1
ipam_gc_expired_total 5
`

func TestParseMetric(t *testing.T) {
	ss, err := parseMetric(exposition, kubeRequestsMetric)
	if err != nil {
		t.Fatal(err)
	}
	if len(ss) != 4 {
		t.Fatalf("%d series; want the 4 of %s: %+v", len(ss), kubeRequestsMetric, ss)
	}
	if ss[2].Labels["method"] != "PUT" || ss[2].Labels["code"] != "409" || ss[2].Value != 3 {
		t.Errorf("third series %+v; want PUT 409 = 3", ss[2])
	}
	if ss[3].Value != 1 {
		t.Errorf("a series with a timestamp: value %v; want 1", ss[3].Value)
	}
	total, by := sumSeries(ss, "method")
	if total != 246 || by["GET"] != 13 || by["PUT"] != 233 || len(by) != 2 {
		t.Errorf("sum %v by method %v; want 246, GET 13, PUT 233", total, by)
	}

	leader, err := parseMetric(exposition, leaderMetric)
	if err != nil || len(leader) != 1 || leader[0].Value != 1 || len(leader[0].Labels) != 0 {
		t.Errorf("leader: %+v, %v; want one unlabelled series of 1", leader, err)
	}
	if none, err := parseMetric(exposition, "ipam_no_such_metric"); err != nil || len(none) != 0 {
		t.Errorf("absent metric: %+v, %v; want none and no error", none, err)
	}
}

func TestParseMetricLabelEscapes(t *testing.T) {
	text := `m{a="x\"y",b="back\\slash",c="line\nbreak", d="{,}"} 2.5e1` + "\n"
	ss, err := parseMetric(text, "m")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"a": `x"y`, "b": `back\slash`, "c": "line\nbreak", "d": "{,}"}
	if len(ss) != 1 || ss[0].Value != 25 || len(ss[0].Labels) != len(want) {
		t.Fatalf("%+v", ss)
	}
	for k, v := range want {
		if ss[0].Labels[k] != v {
			t.Errorf("label %s = %q; want %q", k, ss[0].Labels[k], v)
		}
	}
}

func TestParseMetricMalformed(t *testing.T) {
	for _, line := range []string{
		`m{a="1"}`,          // no value
		`m{a="1"} x`,        // not a number
		`m{a=1} 2`,          // unquoted label value
		`m{a="1} 2`,         // unterminated
		`m{a="1" b="2"} 3`,  // no comma
		`m{a="1"} 2 3 4`,    // too many fields
		`m{a="1",b="2" 3`,   // no closing brace
		`m{a="1"}garbage 3`, // garbage after the brace
	} {
		if ss, err := parseMetric(line+"\n", "m"); err == nil {
			t.Errorf("%q parsed as %+v; want an error", line, ss)
		}
	}
	// A malformed line of another metric is not the caller's business.
	if ss, err := parseMetric("other{a=1} x\nm 4\n", "m"); err != nil || len(ss) != 1 || ss[0].Value != 4 {
		t.Errorf("other metric malformed: %+v, %v", ss, err)
	}
}

func samplesOf(pairs ...float64) []counterSample {
	var s []counterSample
	for i := 0; i+1 < len(pairs); i += 2 {
		s = append(s, counterSample{Sec: pairs[i], Count: pairs[i+1]})
	}
	return s
}

func TestRates(t *testing.T) {
	s := samplesOf(0, 100, 1, 110, 2, 170, 3.5, 200)
	if got := avgRate(s); got != 100.0/3.5 {
		t.Errorf("avgRate %v; want %v", got, 100.0/3.5)
	}
	if got := maxRate(s, 1); got != 60 {
		t.Errorf("maxRate %v; want 60 (110 -> 170 in 1 s)", got)
	}
	if avgRate(s[:1]) != 0 || maxRate(nil, 1) != 0 || avgRate(samplesOf(1, 5, 1, 9)) != 0 || maxRate(samplesOf(0, 0, 0.5, 9), 1) != 0 {
		t.Error("rates of fewer than two samples, or no time, or no window long enough, must be 0")
	}
	// A burst counted between two samples half a second apart is not a
	// rate of 80/s: each window runs at least a second.
	if got := maxRate(samplesOf(0, 0, 0.5, 40, 1.5, 60), 1); got != 40 {
		t.Errorf("maxRate over a short gap: %v; want 40 (60 in 1.5 s)", got)
	}
}

func TestWorstWindow(t *testing.T) {
	const qps, burst, slack = 20.0, 40, 1.0
	// Within: the burst and then 20/s.
	ok := worstWindow(samplesOf(0, 0, 1, 60, 2, 80, 3, 100, 4, 120), qps, burst, slack)
	if !ok.ok() {
		t.Errorf("a client at its bucket's pace judged over: %+v", ok)
	}
	// The tightest window of that pace is the longest from the start, the
	// burst in it: 120 of 40 + 20 x 5.
	if ok.FromSec != 0 || ok.ToSec != 4 || ok.Requests != 120 || ok.Allowed != 140 {
		t.Errorf("worst window %+v; want 0-4 s, 120 of 140", ok)
	}
	// Over: 30/s for 10 s passes every one-second window (30 < 80) but
	// not the long ones: 300 in 10 s against 40 + 20 x 11 = 260.
	var fast []counterSample
	for i := range 11 {
		fast = append(fast, counterSample{Sec: float64(i), Count: 30 * float64(i)})
	}
	over := worstWindow(fast, qps, burst, slack)
	if over.ok() || over.FromSec != 0 || over.ToSec != 10 || over.Requests != 300 || over.Allowed != 260 {
		t.Errorf("30/s for 10 s: %+v; want 0-10 s, 300 over 260", over)
	}
	if w := worstWindow(fast[:1], qps, burst, slack); !w.ok() || w != (bucketWindow{}) {
		t.Errorf("one sample: %+v; want the zero window", w)
	}
}

// TestWorstWindowOfATokenBucket: a client that sends as fast as a token
// bucket lets it, counted at 1 s samples with jitter, passes the check,
// and comes close to its bound, so the check is not vacuous.
func TestWorstWindowOfATokenBucket(t *testing.T) {
	const qps, burst = 20.0, 40
	// The bucket starts full; a request leaves whenever a token is there
	// (steps of 1 ms); each answer is counted 30 ms after it left.
	var sent []float64
	tokens := float64(burst)
	for ms := range 30_000 {
		now := float64(ms) / 1000
		tokens = min(float64(burst), tokens+qps/1000)
		for tokens >= 1 {
			tokens--
			sent = append(sent, now+0.030)
		}
	}
	s := []counterSample{{Sec: 0, Count: 0}} // before the burst's answers
	for i := range 29 {
		at := float64(i) + 0.2 + 0.1*math.Sin(float64(i)) // not on the second
		n := 0
		for _, c := range sent {
			if c <= at {
				n++
			}
		}
		s = append(s, counterSample{Sec: at, Count: float64(n)})
	}
	w := worstWindow(s, qps, burst, ciliumCountSlack.Seconds())
	if !w.ok() {
		t.Fatalf("a client within its bucket judged over: %+v", w)
	}
	if w.Requests/w.Allowed < 0.8 {
		t.Errorf("worst window %+v uses %.2f of the bound; a saturated bucket should come close", w, w.Requests/w.Allowed)
	}
	// Twice the rate (a second bucket of the same size beside it) fails.
	double := slices.Clone(s)
	for i := range double {
		double[i].Count *= 2
	}
	if w := worstWindow(double, qps, burst, ciliumCountSlack.Seconds()); w.ok() {
		t.Errorf("two saturated buckets judged within one: %+v", w)
	}
}

func TestRequestFigures(t *testing.T) {
	// Idle at 1/s for 3 s, busy 3 -> 13 s with 240 requests, settle.
	s := samplesOf(0, 0, 1, 1, 2, 2, 3, 3, 4, 63, 8, 143, 13, 243, 14, 244, 18, 248)
	r := requestFigures(s, 3, 6, 20, 40, 1)
	if r.Total != 248 || r.IdlePerSec != 1 || r.BusySeconds != 10 || r.BusyRequests != 240 {
		t.Fatalf("total %v idle %v busy %v s %v requests; want 248, 1, 10, 240", r.Total, r.IdlePerSec, r.BusySeconds, r.BusyRequests)
	}
	if r.AvgPerSec != 24 || r.AvgRatio != 1.2 || r.SustainedPerSec != 20 || r.SustainedRatio != 1 {
		t.Errorf("avg %v (x%v) sustained %v (x%v); want 24 (x1.2), 20 (x1)", r.AvgPerSec, r.AvgRatio, r.SustainedPerSec, r.SustainedRatio)
	}
	if r.MaxPerSec != 60 || r.MaxRatio != 3 {
		t.Errorf("max %v (x%v); want 60 (x3)", r.MaxPerSec, r.MaxRatio)
	}
	if !r.Worst.ok() || len(r.Samples) != len(s) {
		t.Errorf("worst %+v, %d samples", r.Worst, len(r.Samples))
	}
	// Fewer requests than the burst: nothing sustained.
	if r := requestFigures(samplesOf(0, 0, 1, 0, 2, 10), 1, 2, 20, 40, 1); r.SustainedPerSec != 0 || r.AvgPerSec != 10 {
		t.Errorf("under the burst: sustained %v avg %v; want 0, 10", r.SustainedPerSec, r.AvgPerSec)
	}
	if r := requestFigures(nil, 0, 0, 20, 40, 1); r.Total != 0 || !r.Worst.ok() {
		t.Errorf("no samples: %+v", r)
	}
}

func TestSecondsOf(t *testing.T) {
	var ds []time.Duration
	for i := 100; i >= 1; i-- {
		ds = append(ds, time.Duration(i)*100*time.Millisecond) // 0.1 .. 10 s, unsorted
	}
	got := secondsOf(ds)
	if want := (secondsStats{P50: 5, P90: 9, P99: 9.9, Max: 10}); math.Abs(got.P50-want.P50) > 1e-9 || math.Abs(got.P90-want.P90) > 1e-9 ||
		math.Abs(got.P99-want.P99) > 1e-9 || got.Max != want.Max {
		t.Errorf("secondsOf = %+v; want %+v", got, want)
	}
	if got := secondsOf(nil); got != (secondsStats{}) {
		t.Errorf("secondsOf(nil) = %+v", got)
	}
}

func TestPoolDuplicates(t *testing.T) {
	pools := map[string][]string{
		"a": {"172.16.0.1", "172.16.0.2"},
		"b": {"172.16.0.65", "172.16.0.2"},
		"c": {"172.16.0.1", "172.16.0.129"},
	}
	if got := poolDuplicates(pools); !slices.Equal(got, []string{"172.16.0.1", "172.16.0.2"}) {
		t.Errorf("poolDuplicates = %v", got)
	}
	if got := poolDuplicates(map[string][]string{"a": {"172.16.0.1"}, "b": {"172.16.0.2"}}); len(got) != 0 {
		t.Errorf("disjoint pools: %v", got)
	}
}

func TestPoolMismatches(t *testing.T) {
	kube := map[string][]string{
		"a": {"172.16.0.2", "172.16.0.1"}, // order does not matter
		"b": {"172.16.0.65"},
		"c": {"172.16.0.129"}, // the database does not know it
	}
	db := map[string][]string{
		"a": {"172.16.0.1", "172.16.0.2"},
		"b": {"172.16.0.65", "172.16.0.66"}, // one more than the pool
		"d": {"172.16.0.193"},               // no CiliumNode shows it
	}
	got := poolMismatches(kube, db)
	if len(got) != 3 || !strings.HasPrefix(got[0], "b:") || !strings.HasPrefix(got[1], "c:") || !strings.HasPrefix(got[2], "d:") {
		t.Fatalf("poolMismatches = %q; want b, c and d", got)
	}
	if !strings.Contains(got[0], "172.16.0.66") {
		t.Errorf("%q does not show the extra address", got[0])
	}
	if got := poolMismatches(map[string][]string{"a": {"1"}}, map[string][]string{"a": {"1"}}); len(got) != 0 {
		t.Errorf("equal: %q", got)
	}
}

func TestNodeWatch(t *testing.T) {
	w := newNodeWatch([]string{"n1", "n2"})
	node := func(name string, addrs int) *ciliumv2.CiliumNode {
		cn := &ciliumv2.CiliumNode{ObjectMeta: metav1.ObjectMeta{Name: name}}
		cn.Spec.IPAM.Pool = ipamtypes.AllocationMap{}
		for i := range addrs {
			cn.Spec.IPAM.Pool[strings.Repeat("x", i+1)] = ipamtypes.AllocationIP{}
		}
		return cn
	}
	t0 := time.Unix(1000, 0)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	w.observe(node("n1", 0), at(0))
	w.observe(node("n1", 2), at(1))
	w.observe(node("other", 8), at(1)) // not the phase's
	w.observe(node("n1", 8), at(2))
	w.observe(node("n1", 9), at(3)) // later events change nothing
	w.observe(node("n1", 1), at(4))
	select {
	case <-w.all:
		t.Fatal("all closed with n2 not reached")
	default:
	}
	w.observe(node("n2", 8), at(5)) // ready and reached at once
	select {
	case <-w.all:
	default:
		t.Fatal("all not closed once every node reached")
	}
	w.observe(node("n2", 8), at(6)) // no second close
	reached, ready, _ := w.times()
	if len(reached) != 2 || reached["n1"] != at(2) || reached["n2"] != at(5) {
		t.Errorf("reached %v", reached)
	}
	if len(ready) != 2 || ready["n1"] != at(1) || ready["n2"] != at(5) {
		t.Errorf("ready %v", ready)
	}
}

func TestLeaseAddr(t *testing.T) {
	for in, want := range map[string]string{
		"172.16.0.5/26": "172.16.0.5", // the API's lease address
		"172.16.0.5":    "172.16.0.5", // a CiliumNode's pool entry
		"fd00::0:5/64":  "fd00::5",
		"fd00:0::5":     "fd00::5",
	} {
		if got, err := leaseAddr(in); err != nil || got != want {
			t.Errorf("leaseAddr(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	if got, err := leaseAddr("172.16.0"); err == nil {
		t.Errorf("leaseAddr of no address = %q", got)
	}
}

// TestCiliumSkipsWithoutKubeBinaries: without kube-apiserver and etcd the
// phase says so, naming make tools, and fails nothing.
func TestCiliumSkipsWithoutKubeBinaries(t *testing.T) {
	t.Setenv(kubetest.BinDirEnv, t.TempDir())
	cfg, err := parseConfig(nil)
	if err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	var failed []string
	rep, err := runCilium(t.Context(), cfg, serverOptions{}, nil, nil, true, &out, &failed)
	if err != nil {
		t.Fatal(err)
	}
	if rep == nil || !strings.Contains(rep.Skipped, "make tools") || !strings.Contains(rep.Skipped, "kube-apiserver") {
		t.Fatalf("report %+v; want skipped, naming make tools", rep)
	}
	if !strings.Contains(out.String(), "cilium: skipped: ") || len(failed) != 0 {
		t.Errorf("output %q, failed %v; want the skip printed and nothing failed", out.String(), failed)
	}
	var sum strings.Builder
	printCiliumSummary(&sum, rep)
	if !strings.Contains(sum.String(), "cilium: skipped: ") {
		t.Errorf("summary %q does not show the skip", sum.String())
	}
}

func TestCiliumFailures(t *testing.T) {
	good := func() *ciliumReport {
		return &ciliumReport{Nodes: 200, PreAllocate: 8, QPS: 20, Burst: 40, Reached: 200,
			Requests: kubeRequests{Worst: bucketWindow{FromSec: 4, ToSec: 12, Requests: 200, Allowed: 220}}}
	}
	if got := good().failures(2 * time.Minute); len(got) != 0 {
		t.Fatalf("a good phase fails: %q", got)
	}
	if got := (&ciliumReport{Skipped: "no kube-apiserver"}).failures(time.Minute); len(got) != 0 {
		t.Errorf("a skipped phase fails: %q", got)
	}
	for _, tt := range []struct {
		name  string
		spoil func(*ciliumReport)
		want  string
	}{
		{"a create refused", func(r *ciliumReport) { r.CreateErrors = 1 }, "1 of 200 CiliumNode creates failed"},
		{"a node not served", func(r *ciliumReport) { r.Reached = 199 }, "199 of 200 nodes reached 8 addresses within 2m0s"},
		{"over the bucket", func(r *ciliumReport) { r.Requests.Worst.Requests = 221 }, "221 requests to the API server in 8.0s (4.0-12.0s), over the 220"},
		{"an address in two pools", func(r *ciliumReport) { r.Duplicates = 1 }, "1 addresses in two nodes' pools"},
		{"a pool unlike the database", func(r *ciliumReport) { r.Mismatches = 2 }, "2 nodes' pools"},
		{"an address unlike the database", func(r *ciliumReport) { r.AddressMismatches = 3 }, "3 addresses differ from the database"},
	} {
		r := good()
		tt.spoil(r)
		got := r.failures(2 * time.Minute)
		if len(got) != 1 || !strings.Contains(got[0], tt.want) {
			t.Errorf("%s: failures %q; want one containing %q", tt.name, got, tt.want)
		}
	}
}

func TestCountWithin(t *testing.T) {
	ds := []time.Duration{time.Second, 2 * time.Minute, 2*time.Minute + 1, 3 * time.Minute}
	if got := countWithin(ds, 2*time.Minute); got != 2 {
		t.Errorf("countWithin = %d; want 2 (the bound itself counts)", got)
	}
}

func TestSinceCreated(t *testing.T) {
	t0 := time.Unix(1000, 0)
	nodes := []string{"a", "b", "c", "d"}
	created := []time.Time{t0, t0.Add(time.Second), t0, t0}
	errs := []error{nil, nil, errors.New("refused"), nil}
	at := map[string]time.Time{"a": t0.Add(3 * time.Second), "b": t0.Add(3 * time.Second), "c": t0.Add(time.Second)} // d never
	got := sinceCreated(nodes, created, errs, at)
	if !slices.Equal(got, []time.Duration{3 * time.Second, 2 * time.Second}) {
		t.Errorf("sinceCreated = %v; want 3s (a), 2s (b); c failed, d never got there", got)
	}
}

// A slow scrape: the counter was read somewhere in its round trip, so a
// window is as wide as from the first scrape's send to the last one's
// answer. Taken at the middle (as before), 1,000 requests that came at
// 100 a second over 9 s looked over a bucket of burst 200 and QPS 100.
func TestWorstWindowSlowScrape(t *testing.T) {
	const qps, burst, slack = 100, 200, 1.0
	s := []counterSample{{Sec: 0.05, Count: 0, SentSec: 0, RecvSec: 0.1}, {Sec: 5, Count: 1000, SentSec: 1, RecvSec: 9}}
	if w := worstWindow(s, qps, burst, slack); !w.ok() || w.Allowed != 200+100*(9-0+1) {
		t.Fatalf("window %+v: want ok, allowed 1200", w)
	}
	// Without the round trip's ends the middles are all there is.
	mid := []counterSample{{Sec: 0, Count: 0}, {Sec: 5, Count: 1000}}
	if w := worstWindow(mid, qps, burst, slack); w.ok() {
		t.Fatalf("window %+v: want over", w)
	}
	// Fast scrapes: the same 1,000 in 5 s are over, round trips or not.
	fast := []counterSample{{Sec: 0.05, Count: 0, SentSec: 0, RecvSec: 0.1}, {Sec: 5, Count: 1000, SentSec: 4.95, RecvSec: 5.05}}
	if w := worstWindow(fast, qps, burst, slack); w.ok() {
		t.Fatalf("window %+v: want over", w)
	}
}
