// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"strings"
	"testing"
	"time"
)

func TestAuditWrites(t *testing.T) {
	kill := time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)
	ev := func(stage, verb, resource, sub, ns, name string, at time.Time) string {
		return `{"kind":"Event","stage":"` + stage + `","verb":"` + verb + `","objectRef":{"resource":"` + resource +
			`","subresource":"` + sub + `","namespace":"` + ns + `","name":"` + name + `"},"responseStatus":{"code":200},"requestReceivedTimestamp":"` +
			at.Format(time.RFC3339Nano) + `"}`
	}
	after, before := kill.Add(time.Second), kill.Add(-time.Millisecond)
	log := strings.Join([]string{
		ev("ResponseComplete", "update", "ciliumnodes", "", "", "n1", after),       // counted
		ev("ResponseComplete", "update", "ciliumnodes", "status", "", "n1", after), // counted (status)
		ev("ResponseComplete", "patch", "ciliumnodes", "", "", "n2", kill),         // counted: at the kill
		ev("ResponseComplete", "update", "ciliumnodes", "", "", "n3", before),      // the old leader's
		ev("ResponseStarted", "update", "ciliumnodes", "", "", "n1", after),        // not a completion
		ev("ResponseComplete", "create", "ciliumnodes", "", "", "late1", after),    // the bench's create
		ev("ResponseComplete", "update", "ciliumnodes", "", "", "late1", after),    // a late node's
		ev("ResponseComplete", "update", "services", "status", "ns", "n1", after),  // another resource
		ev("ResponseComplete", "update", "ciliumnodes", "", "", "unknown", after),  // neither set
	}, "\n") + "\n"
	converged := map[string]bool{"n1": true, "n2": true, "n3": true}
	late := map[string]bool{"late1": true}
	w, lw, samples, err := auditWrites(strings.NewReader(log), "ciliumnodes", kill, converged, late)
	if err != nil {
		t.Fatal(err)
	}
	if w != 3 || lw != 1 || len(samples) != 3 {
		t.Fatalf("writes %d, late %d, samples %q; want 3, 1 and 3 samples", w, lw, samples)
	}
	if !strings.Contains(samples[1], "update ciliumnodes/status n1: 200") {
		t.Errorf("sample %q does not name the status write", samples[1])
	}

	// Services are keyed namespace/name.
	w, _, _, err = auditWrites(strings.NewReader(log), "services", kill, map[string]bool{"ns/n1": true}, nil)
	if err != nil || w != 1 {
		t.Fatalf("services: writes %d, err %v; want 1", w, err)
	}
	if _, _, _, err := auditWrites(strings.NewReader("{not json\n"), "services", kill, nil, nil); err == nil {
		t.Fatal("a malformed line: no error")
	}
}

func TestTakeoverFailures(t *testing.T) {
	ok := &takeoverReport{Late: 10, LateServed: 10, AllServedSeconds: 12, RSS: []rssSample{{PeakMiB: 120}, {PeakMiB: 399, SampledMaxMiB: 380}}}
	if f := ok.failures("cilium"); len(f) != 0 {
		t.Fatalf("targets met: failures %q", f)
	}
	for _, c := range []struct {
		name string
		edit func(*takeoverReport)
		want string
	}{
		{"writes to converged objects", func(r *takeoverReport) { r.Writes = 1 }, "wrote 1 times"},
		{"a late object not served", func(r *takeoverReport) { r.LateServed = 9 }, "9 of 10"},
		{"served after the bound", func(r *takeoverReport) { r.AllServedSeconds = 61 }, "not every object served within 1m0s"},
		{"never all served", func(r *takeoverReport) { r.AllServedSeconds = -1 }, "not every object served"},
		{"sampled RSS over", func(r *takeoverReport) { r.RSS[0].SampledMaxMiB = 401 }, "replica 0 peak RSS 401.0 MiB"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := *ok
			r.RSS = append([]rssSample(nil), ok.RSS...)
			c.edit(&r)
			f := r.failures("cilium")
			if len(f) != 1 || !strings.Contains(f[0], c.want) {
				t.Fatalf("failures %q; want one with %q", f, c.want)
			}
		})
	}
	var none *takeoverReport
	if f := none.failures("lbipam"); f != nil {
		t.Fatalf("no takeover: failures %q", f)
	}
}

func TestServedTimes(t *testing.T) {
	lead := time.Unix(100, 0)
	at := map[string]time.Time{"a": lead.Add(-time.Second), "b": lead.Add(30 * time.Second), "c": lead.Add(70 * time.Second)}
	ds, within, last, all := servedTimes([]string{"a", "b", "c"}, at, lead, time.Minute)
	if len(ds) != 3 || within != 2 || !last.Equal(at["c"]) || !all || ds[0] != 0 {
		t.Fatalf("ds %v within %d last %v all %v", ds, within, last, all)
	}
	if _, _, _, all := servedTimes([]string{"a", "d"}, at, lead, time.Minute); all {
		t.Fatal("d never served: all")
	}
}
