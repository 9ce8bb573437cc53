// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
)

// The takeover part of the cilium and lbipam phases: two server replicas
// on the same database elect a leader through their Lease; once every
// object is served, the leader is SIGKILLed (a crash: its Lease is not
// given up, so the standby waits for it to expire), a few objects are
// created while no replica leads, and the phase measures the time from
// the kill until the standby leads, from its lead until every object is
// served, and the writes the new leader issues for objects that were
// already served before the kill (target 0: an initial sync that writes
// every object costs a fleet's worth of requests at the client's QPS,
// and wakes every agent). The writes are counted in the kube-apiserver's
// audit log (update and patch of CiliumNodes and Services, their status
// included), which records every write request, even one that changes
// nothing and so leaves the object's resourceVersion as it was.
const (
	// takeoverServeBound: every object served within this of the new
	// lead (the acceptance).
	takeoverServeBound = 60 * time.Second
	// takeoverLeadLimit bounds the wait for the standby to lead: the
	// Lease's expiry (15 s) and, for the operator, its caches' sync and
	// the restore of every node.
	takeoverLeadLimit = 3 * time.Minute
	// rssLimitMiB is the acceptance's bound on each replica's peak RSS.
	rssLimitMiB = 400
	// takeoverSettle is how long writes are still counted once every
	// object is served.
	takeoverSettle = 5 * time.Second
)

// takeoverLate is how many objects are created while no replica leads:
// 1% of the phase's, at least 10.
func takeoverLate(n int) int { return max(10, n/100) }

// takeoverReport is the takeover part of a phase.
type takeoverReport struct {
	Replicas   int `json:"replicas"`
	KilledPID  int `json:"killedPid"`
	StandbyPID int `json:"standbyPid"`
	// ToLeadSeconds is from the SIGKILL to the standby leading: for the
	// operator, serving (ipam_cilium_operator_leader 1: caches synced,
	// every node restored); for LB IPAM, holding the Lease.
	ToLeadSeconds float64 `json:"toLeadSeconds"`
	// Converged objects were served before the kill; Late ones were
	// created right after it. LateServed counts the late ones served
	// within takeoverServeBound of the lead, ToServed the time from the
	// lead to each one's serving.
	Converged  int          `json:"converged"`
	Late       int          `json:"late"`
	LateServed int          `json:"lateServed"`
	ToServed   secondsStats `json:"toServedSeconds"`
	// AllServedSeconds is from the lead until every object was served:
	// every late one, and (operator) the new leader's first round over
	// every node done (its ok rounds at least the nodes). -1 when the
	// bound passed first.
	AllServedSeconds float64 `json:"allServedSeconds"`
	// Writes are the update and patch requests, after the kill, for
	// objects converged before it (WriteSamples: a few); LateWrites those
	// for the late objects.
	Writes       int      `json:"writesConverged"`
	WriteSamples []string `json:"writeSamples,omitempty"`
	LateWrites   int      `json:"writesLate"`
	// NewLeaderRequests are the new leader's requests to the API server,
	// by method, from the kill to the end (operator only).
	NewLeaderRequests map[string]float64 `json:"newLeaderRequests,omitempty"`
	// RSS is each replica's memory over the whole phase (the killed
	// one's as read just before its kill).
	RSS []rssSample `json:"rss"`
}

// failures are the takeover's missed targets, prefixed with the phase.
func (t *takeoverReport) failures(phase string) []string {
	if t == nil {
		return nil
	}
	var out []string
	if t.Writes > 0 {
		out = append(out, fmt.Sprintf("%s takeover: the new leader wrote %d times to objects served before the kill (target 0)", phase, t.Writes))
	}
	if t.LateServed < t.Late || t.AllServedSeconds < 0 || t.AllServedSeconds > takeoverServeBound.Seconds() {
		out = append(out, fmt.Sprintf("%s takeover: not every object served within %v of the new lead (%d of %d created during the takeover; all served after %.1fs)",
			phase, takeoverServeBound, t.LateServed, t.Late, t.AllServedSeconds))
	}
	for i, s := range t.RSS {
		if m := max(s.PeakMiB, s.SampledMaxMiB); m > rssLimitMiB {
			out = append(out, fmt.Sprintf("%s: replica %d peak RSS %.1f MiB over %d MiB", phase, i, m, rssLimitMiB))
		}
	}
	return out
}

// line prints the takeover's figures.
func (t *takeoverReport) line(phase string) string {
	var rss []string
	for i, s := range t.RSS {
		rss = append(rss, fmt.Sprintf("r%d %.0f MiB", i, max(s.PeakMiB, s.SampledMaxMiB)))
	}
	all := fmt.Sprintf("%.1fs", t.AllServedSeconds)
	if t.AllServedSeconds < 0 {
		all = "never"
	}
	s := fmt.Sprintf("%s takeover: %d replicas; SIGKILL of the leader (pid %d), standby (pid %d) leads after %.1fs; every object served %s after the lead (%d created during the takeover: %d served, p50 %.2fs max %.2fs after the lead); writes for the %d served before the kill: %d (target 0), for the new ones: %d; peak RSS %s (target <= %d MiB)",
		phase, t.Replicas, t.KilledPID, t.StandbyPID, t.ToLeadSeconds, all, t.Late, t.LateServed, t.ToServed.P50, t.ToServed.Max,
		t.Converged, t.Writes, t.LateWrites, strings.Join(rss, ", "), rssLimitMiB)
	if len(t.NewLeaderRequests) > 0 {
		s += "; new leader's requests " + methods(t.NewLeaderRequests)
	}
	return s
}

// auditPolicy records every write of CiliumNodes and Services, their
// status included, and nothing else.
const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
  verbs: ["update", "patch"]
  resources:
  - group: "cilium.io"
    resources: ["ciliumnodes", "ciliumnodes/status"]
  - group: ""
    resources: ["services", "services/status"]
- level: None
`

// auditedDir makes a phase's temporary directory (pattern as
// os.MkdirTemp's) with an audit policy in it, and answers the
// kube-apiserver flags that log the writes to CiliumNodes and Services
// to logPath there: the takeover counts the new leader's writes in it.
func auditedDir(pattern string) (dir string, flags []string, logPath string, err error) {
	dir, err = os.MkdirTemp("", pattern)
	if err != nil {
		return "", nil, "", err
	}
	policy := filepath.Join(dir, "audit-policy.yaml")
	if err := os.WriteFile(policy, []byte(auditPolicy), 0o600); err != nil {
		os.RemoveAll(dir)
		return "", nil, "", err
	}
	logPath = filepath.Join(dir, "audit.log")
	return dir, []string{"--audit-policy-file=" + policy, "--audit-log-path=" + logPath, "--audit-log-maxsize=0"}, logPath, nil
}

// auditEvent is the part of an audit.k8s.io/v1 Event the count reads.
type auditEvent struct {
	Stage     string `json:"stage"`
	Verb      string `json:"verb"`
	ObjectRef struct {
		Resource    string `json:"resource"`
		Subresource string `json:"subresource"`
		Namespace   string `json:"namespace"`
		Name        string `json:"name"`
	} `json:"objectRef"`
	ResponseStatus struct {
		Code int `json:"code"`
	} `json:"responseStatus"`
	Received time.Time `json:"requestReceivedTimestamp"`
}

// auditWrites counts the completed update and patch requests of resource
// received at or after since, split between the objects of converged
// (namespace/name, or name for a cluster-scoped one) and the others of
// late; samples describe a few of the converged ones.
func auditWrites(r io.Reader, resource string, since time.Time, converged, late map[string]bool) (writes, lateWrites int, samples []string, err error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	for sc.Scan() {
		var ev auditEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return 0, 0, nil, fmt.Errorf("audit log: %w", err)
		}
		if ev.Stage != "ResponseComplete" || (ev.Verb != "update" && ev.Verb != "patch") || ev.ObjectRef.Resource != resource || ev.Received.Before(since) {
			continue
		}
		key := ev.ObjectRef.Name
		if ev.ObjectRef.Namespace != "" {
			key = ev.ObjectRef.Namespace + "/" + key
		}
		switch {
		case converged[key]:
			writes++
			if len(samples) < 5 {
				sub := ""
				if ev.ObjectRef.Subresource != "" {
					sub = "/" + ev.ObjectRef.Subresource
				}
				samples = append(samples, fmt.Sprintf("%s %s%s %s: %d, %.1fs after the kill", ev.Verb, resource, sub, key, ev.ResponseStatus.Code, ev.Received.Sub(since).Seconds()))
			}
		case late[key]:
			lateWrites++
		}
	}
	return writes, lateWrites, samples, sc.Err()
}

// countAuditWrites reads the audit log at path (auditWrites).
func countAuditWrites(path, resource string, since time.Time, converged, late map[string]bool, t *takeoverReport) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	t.Writes, t.LateWrites, t.WriteSamples, err = auditWrites(f, resource, since, converged, late)
	return err
}

// holderPID answers the process id in the holder identity of a Lease
// (the server's is host-PID, package leader), 0 when none holds it.
func holderPID(ctx context.Context, kube kubernetes.Interface, ns, name string) (int, error) {
	l, err := kube.CoordinationV1().Leases(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return 0, err
	}
	if l.Spec.HolderIdentity == nil || *l.Spec.HolderIdentity == "" {
		return 0, nil
	}
	id := *l.Spec.HolderIdentity
	i := strings.LastIndexByte(id, '-')
	pid, err := strconv.Atoi(id[i+1:])
	if err != nil {
		return 0, fmt.Errorf("the Lease %s/%s: holder %q names no process", ns, name, id)
	}
	return pid, nil
}

// waitHolder waits until the Lease's holder is one of srvs and answers
// its index.
func waitHolder(ctx context.Context, kube kubernetes.Interface, ns, name string, srvs []*serverProc, limit time.Duration) (int, error) {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	last := "not read yet"
	for {
		pid, err := holderPID(ctx, kube, ns, name)
		if err != nil {
			last = err.Error()
		} else if i := slices.IndexFunc(srvs, func(s *serverProc) bool { return s.pid() == pid }); i >= 0 {
			return i, nil
		} else {
			last = fmt.Sprintf("held by pid %d", pid)
		}
		select {
		case <-ctx.Done():
			return -1, fmt.Errorf("no replica holds the Lease %s/%s within %v (%s)", ns, name, limit, last)
		case <-tick.C:
		}
	}
}

// killLeader SIGKILLs srv (a crash) and waits for its exit, answering
// the instant of the kill and its memory just before.
func killLeader(srv *serverProc) (time.Time, procMemory) {
	mem, _ := readProcMemory(srv.pid())
	at := time.Now()
	_ = srv.cmd.Process.Kill()
	<-srv.done
	return at, mem
}

// replicaRSS is each replica's memory over the phase, the killed one's
// (index killed, -1 for none) as read before its kill.
func replicaRSS(w *rssWatch, killed int, before procMemory) []rssSample {
	ss := w.stop()
	if killed >= 0 && killed < len(ss) {
		s := &ss[killed]
		s.Error = ""
		s.PeakMiB, s.EndMiB = mib(before.Peak), mib(before.RSS)
		s.SampledMaxMiB = max(s.SampledMaxMiB, s.PeakMiB)
	}
	return ss
}

// servedTimes answers, for the late names served (in at), the time from
// lead to each, and how many came within bound.
func servedTimes(late []string, at map[string]time.Time, lead time.Time, bound time.Duration) (ds []time.Duration, within int, last time.Time, all bool) {
	all = true
	for _, n := range late {
		t, ok := at[n]
		if !ok {
			all = false
			continue
		}
		d := max(0, t.Sub(lead))
		ds = append(ds, d)
		if d <= bound {
			within++
		}
		if t.After(last) {
			last = t
		}
	}
	return ds, within, last, all
}
