// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"

	"github.com/ipam-dev/ipam/api/ipamclient"
	"github.com/ipam-dev/ipam/internal/kubetest"
	"github.com/ipam-dev/ipam/internal/lbipam"
)

// The lbipam phase runs the service as Cilium's LB IPAM against a real
// kube-apiserver and etcd (the ones of the cilium phase): one more server
// process with --lbipam leads, a probe Service shows it serving, then
// -lbipam-services LoadBalancer Services are created at once and the phase
// times each from its create call to the first watch event showing its
// ingress address with the condition satisfied. Then as many Services
// labelled for a pool that does not exist yet are created and wait
// (no_pool); the pool is created through the REST API, and the phase
// times each from the pool's create to its ingress: what the controller's
// event-driven re-evaluation (the database's change notifications) buys
// over its one-minute resync. At the end every Service holds one address
// of its pool and no two hold the same.
const (
	lbPool      = "lbipam-bench"
	lbPoolCIDR  = "198.18.0.0/18"
	lbLatePool  = "lbipam-bench-late"
	lbLateCIDR  = "198.18.64.0/18"
	lbNamespace = "lbipam-bench"
	lbLeaseNS   = "default"
	// lbWaveLabel marks the Services of the late pool; the first pool
	// passes them over.
	lbWaveLabel = "lbipam-bench/wave"
	// lbServiceCIDR is the API server's ClusterIP range in the phase:
	// both waves' ClusterIPs and the takeover's.
	lbServiceCIDR = "10.96.0.0/18"
	// lbLeaseName is the server's LB IPAM Lease (lbipam.Config).
	lbLeaseName = "ipam-lbipam"
)

// lbipamReport is the phase's figures.
type lbipamReport struct {
	Skipped  string `json:"skipped,omitempty"`
	Services int    `json:"services"`
	// WaitingServices is the second wave's size.
	WaitingServices int          `json:"waitingServices"`
	QPS             float64      `json:"qps"`
	Burst           int          `json:"burst"`
	BoundSeconds    float64      `json:"boundSeconds"`
	CreateErrors    int          `json:"createErrors"`
	Satisfied       int          `json:"satisfied"`
	ToIngress       secondsStats `json:"toIngressSeconds"`
	// Waited is how many Services of the second wave showed no_pool
	// before their pool was created, LateSatisfied how many were then
	// satisfied within the bound, AfterPool the time from the pool's
	// create call to each one's ingress.
	Waited        int          `json:"waited"`
	LateSatisfied int          `json:"lateSatisfied"`
	AfterPool     secondsStats `json:"afterPoolSeconds"`
	// Distinct counts the distinct addresses the Services hold at the
	// end; Duplicates the Services holding an address another holds.
	Distinct   int `json:"distinct"`
	Duplicates int `json:"duplicates"`
	// Takeover is the leader's SIGKILL with two replicas or more
	// (takeover.go); nil with one.
	Takeover *takeoverReport `json:"takeover,omitempty"`
	// RSS is each replica's memory over the phase.
	RSS []rssSample `json:"rss"`
}

func (r *lbipamReport) failures(bound time.Duration) []string {
	var out []string
	if r.Skipped != "" {
		return nil
	}
	if r.CreateErrors > 0 {
		out = append(out, fmt.Sprintf("lbipam: %d Service creates failed", r.CreateErrors))
	}
	if r.Satisfied < r.Services {
		out = append(out, fmt.Sprintf("lbipam: %d of %d Services satisfied within %v", r.Satisfied, r.Services, bound))
	}
	if r.Duplicates > 0 {
		out = append(out, fmt.Sprintf("lbipam: %d Services hold an address another holds", r.Duplicates))
	}
	if r.Waited < r.WaitingServices {
		out = append(out, fmt.Sprintf("lbipam: %d of %d second-wave Services showed no_pool before their pool", r.Waited, r.WaitingServices))
	}
	if r.LateSatisfied < r.WaitingServices {
		out = append(out, fmt.Sprintf("lbipam: %d of %d second-wave Services satisfied within %v of their pool", r.LateSatisfied, r.WaitingServices, bound))
	}
	if r.Takeover != nil {
		out = append(out, r.Takeover.failures("lbipam")...)
	} else {
		out = append(out, (&takeoverReport{RSS: r.RSS}).failures("lbipam")...)
	}
	return out
}

func runLBIPAM(ctx context.Context, cfg config, so serverOptions, probe *http.Client, admin *ipamclient.ClientWithResponses, private bool, out io.Writer, failed *[]string) (*lbipamReport, error) {
	rep := &lbipamReport{Services: cfg.LBServices, WaitingServices: cfg.LBWaiting, QPS: cfg.LBQPS, Burst: cfg.LBBurst, BoundSeconds: cfg.LBBound.Seconds()}
	dir, audit, auditLog, err := auditedDir("ipam-bench-lbipam-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	// ClusterIPs for every Service: the default range holds 254.
	kc, err := kubetest.Launch(kubetest.WithAPIServerFlags(append(audit, "--service-cluster-ip-range="+lbServiceCIDR)...))
	if errors.Is(err, kubetest.ErrNoBinaries) {
		rep = &lbipamReport{Skipped: err.Error()}
		fmt.Fprintf(out, "lbipam: skipped: %s\n", rep.Skipped)
		return rep, nil
	} else if err != nil {
		return nil, err
	}
	defer func() {
		if err := kc.Close(); err != nil {
			fmt.Fprintln(os.Stderr, "ipam-bench: lbipam: stopping the API server:", err)
		}
	}()
	kubeconfig := filepath.Join(dir, "kubeconfig")
	if err := kc.WriteKubeconfig(kc.Config(), kubeconfig); err != nil {
		return nil, err
	}
	if err := createLBPool(ctx, admin, lbPool, lbPoolCIDR, ipamclient.LabelSelectorRequirement{Key: lbWaveLabel, Operator: ipamclient.DoesNotExist}); err != nil {
		return nil, err
	}

	rc := kc.Config()
	rc.QPS, rc.Burst = 1000, 1000
	kube, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	if _, err := kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: lbNamespace}}, metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	names, late := make([]string, cfg.LBServices), make([]string, cfg.LBWaiting)
	for i := range names {
		names[i] = fmt.Sprintf("svc-%04d", i)
	}
	for i := range late {
		late[i] = fmt.Sprintf("late-%04d", i)
	}
	if !private {
		defer func() {
			if err := teardownLBIPAM(context.WithoutCancel(ctx), admin, append(append(names, late...), "probe")); err != nil {
				fmt.Fprintln(os.Stderr, "ipam-bench: lbipam teardown:", err)
			}
		}()
	}

	so.extra = append(slices.Clone(so.extra), "--lbipam", "--kubeconfig", kubeconfig, "--lbipam-lease-namespace", lbLeaseNS,
		"--cilium-kube-qps", strconv.FormatFloat(cfg.LBQPS, 'f', -1, 64), "--cilium-kube-burst", strconv.Itoa(cfg.LBBurst))
	srvs, err := startServers(ctx, cfg.LBReplicas, so, probe)
	if err != nil {
		return nil, fmt.Errorf("the LB IPAM servers: %w", err)
	}
	defer stopServers(srvs)
	rss := watchRSS(serverPIDs(srvs))
	killed, killedMem, rssDone := -1, procMemory{}, false
	defer func() {
		if !rssDone {
			rss.stop()
		}
	}()

	w, err := kube.CoreV1().Services(lbNamespace).Watch(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	defer w.Stop()
	seen := newIngressWatch()
	go seen.follow(w)

	// Serving: the probe Service is satisfied.
	began := time.Now()
	if _, err := kube.CoreV1().Services(lbNamespace).Create(ctx, lbService("probe"), metav1.CreateOptions{}); err != nil {
		return nil, err
	}
	if !seen.wait(ctx, []string{"probe"}, time.Minute) {
		return nil, errors.New("the probe Service was not satisfied within a minute: LB IPAM is not serving")
	}
	lead, err := waitHolder(ctx, kube, lbLeaseNS, lbLeaseName, srvs, time.Minute)
	if err != nil {
		return nil, err
	}
	srv := srvs[lead]
	fmt.Fprintf(out, "lbipam: etcd and kube-apiserver %s; server %s pid %d of %d replicas (--lbipam --cilium-kube-qps %g --cilium-kube-burst %d, pool %s) serving after %.1fs\n",
		kubetest.KubernetesVersion, srv.url, srv.pid(), len(srvs), cfg.LBQPS, cfg.LBBurst, lbPoolCIDR, time.Since(began).Seconds())

	created, errs := createServices(ctx, kube, names, nil)
	for i, err := range errs {
		if err != nil {
			rep.CreateErrors++
			if rep.CreateErrors <= 3 {
				fmt.Fprintf(out, "  create %s: %v\n", names[i], err)
			}
		}
	}
	seen.wait(ctx, names, cfg.LBBound)
	at, addrs := seen.snapshot()
	var ds []time.Duration
	holders := map[string]int{}
	for i, n := range names {
		if t, ok := at[n]; ok && errs[i] == nil {
			ds = append(ds, t.Sub(created[i]))
			holders[addrs[n]]++
		}
	}
	rep.Satisfied, rep.ToIngress, rep.Distinct = len(ds), secondsOf(ds), len(holders)
	for _, n := range holders {
		rep.Duplicates += n - 1
	}
	fmt.Fprintf(out, "lbipam: %d Services created at once: %d satisfied, time to ingress p50 %.2fs p99 %.2fs max %.2fs; %d distinct addresses, %d duplicates\n",
		rep.Services, rep.Satisfied, rep.ToIngress.P50, rep.ToIngress.P99, rep.ToIngress.Max, rep.Distinct, rep.Duplicates)

	// The second wave waits for a pool that does not exist yet.
	_, errs = createServices(ctx, kube, late, map[string]string{lbWaveLabel: "2"})
	for i, err := range errs {
		if err != nil {
			rep.CreateErrors++
			fmt.Fprintf(out, "  create %s: %v\n", late[i], err)
		}
	}
	seen.waitPending(ctx, late, cfg.LBBound)
	rep.Waited = seen.pendingCount(late)
	poolAt := time.Now()
	if err := createLBPool(ctx, admin, lbLatePool, lbLateCIDR, ipamclient.LabelSelectorRequirement{Key: lbWaveLabel, Operator: ipamclient.Exists}); err != nil {
		return nil, err
	}
	seen.wait(ctx, late, cfg.LBBound)
	at, addrs = seen.snapshot()
	ds = ds[:0]
	for _, n := range late {
		if t, ok := at[n]; ok {
			ds = append(ds, t.Sub(poolAt))
			holders[addrs[n]]++
		}
	}
	rep.LateSatisfied, rep.AfterPool, rep.Distinct, rep.Duplicates = len(ds), secondsOf(ds), len(holders), 0
	for _, n := range holders {
		rep.Duplicates += n - 1
	}
	fmt.Fprintf(out, "lbipam: %d Services waiting (%d showed no_pool), then their pool created: %d satisfied, time from the pool to ingress p50 %.2fs p99 %.2fs max %.2fs; %d distinct addresses in all, %d duplicates\n",
		len(late), rep.Waited, rep.LateSatisfied, rep.AfterPool.P50, rep.AfterPool.P99, rep.AfterPool.Max, rep.Distinct, rep.Duplicates)

	if len(srvs) > 1 {
		takeover := make([]string, takeoverLate(cfg.LBServices))
		for i := range takeover {
			takeover[i] = fmt.Sprintf("takeover-%04d", i)
		}
		names = append(names, takeover...) // released with the others
		rep.Takeover, killedMem, err = lbTakeover(ctx, kube, seen, srvs, lead, takeover, auditLog)
		killed = lead
		if err != nil {
			return nil, err
		}
		_, addrs = seen.snapshot()
		holders = map[string]int{}
		for _, a := range addrs {
			holders[a]++
		}
		rep.Distinct, rep.Duplicates = len(holders), 0
		for _, n := range holders {
			rep.Duplicates += n - 1
		}
	}
	rssDone = true
	rep.RSS = replicaRSS(rss, killed, killedMem)
	if rep.Takeover != nil {
		rep.Takeover.RSS = rep.RSS
	}
	printTakeover(out, "lbipam", rep.Takeover, rep.RSS)
	*failed = append(*failed, rep.failures(cfg.LBBound)...)
	for i, s := range srvs {
		if err := s.exited(); err != nil && i != killed {
			*failed = append(*failed, err.Error())
		}
	}
	return rep, nil
}

// lbTakeover SIGKILLs the leading replica srvs[lead] once every Service
// seen follows is satisfied, creates the late Services at once, and
// measures the standby's takeover (takeover.go): from the kill until it
// holds the Lease, from then until each late Service is satisfied, and
// the writes, in the audit log at auditLog, to the Services satisfied
// before the kill. The late Services' names sort after every other's, so
// the new leader's first pass, in the order of its initial list, reaches
// them last.
func lbTakeover(ctx context.Context, kube kubernetes.Interface, seen *ingressWatch, srvs []*serverProc, lead int, late []string, auditLog string) (*takeoverReport, procMemory, error) {
	at, _ := seen.snapshot()
	t := &takeoverReport{Replicas: len(srvs), KilledPID: srvs[lead].pid(), Late: len(late), Converged: len(at), AllServedSeconds: -1}
	killedAt, mem := killLeader(srvs[lead])
	if _, errs := createServices(ctx, kube, late, nil); errors.Join(errs...) != nil {
		return nil, mem, fmt.Errorf("creating the takeover's Services: %w", errors.Join(errs...))
	}
	rest := slices.Delete(slices.Clone(srvs), lead, lead+1)
	next, err := waitHolder(ctx, kube, lbLeaseNS, lbLeaseName, rest, takeoverLeadLimit)
	if err != nil {
		return nil, mem, err
	}
	ledAt := time.Now()
	t.StandbyPID, t.ToLeadSeconds = rest[next].pid(), ledAt.Sub(killedAt).Seconds()
	seen.wait(ctx, late, takeoverLeadLimit)
	now, _ := seen.snapshot()
	ds, within, last, done := servedTimes(late, now, ledAt, takeoverServeBound)
	t.LateServed, t.ToServed = within, secondsOf(ds)
	if done {
		t.AllServedSeconds = max(0, last.Sub(ledAt).Seconds())
	}
	select {
	case <-time.After(takeoverSettle):
	case <-ctx.Done():
		return nil, mem, ctx.Err()
	}
	converged, lateSet := map[string]bool{}, map[string]bool{}
	for n := range at {
		converged[lbNamespace+"/"+n] = true
	}
	for _, n := range late {
		lateSet[lbNamespace+"/"+n] = true
	}
	if err := countAuditWrites(auditLog, "services", killedAt, converged, lateSet, t); err != nil {
		return nil, mem, err
	}
	return t, mem, nil
}

func ptrTo[T any](v T) *T { return &v }

// createLBPool creates a VIP pool of cidr through the REST API, serving
// the Services its one selector requirement selects.
func createLBPool(ctx context.Context, admin *ipamclient.ClientWithResponses, name, cidr string, selects ipamclient.LabelSelectorRequirement) error {
	resp, err := admin.CreateLBPoolWithResponse(ctx, &ipamclient.CreateLBPoolParams{}, ipamclient.LBPoolRequest{
		Name: name, Spec: ipamclient.LBPoolSpec{Blocks: []ipamclient.LBBlock{{Cidr: ptrTo(cidr)}},
			ServiceSelector: &ipamclient.LabelSelector{MatchExpressions: &[]ipamclient.LabelSelectorRequirement{selects}}}})
	if err != nil {
		return err
	}
	return statusError("create VIP pool "+name, resp.StatusCode(), resp.Body)
}

// lbCreatesInFlight bounds the phase's concurrent Service creates. Each
// create allocates a ClusterIP (two more writes in etcd): 5,000 at once
// kept the API server busy past its 60 s request timeout, and 3,644 of a
// wave were refused with 504. A Service's time runs from its own create
// call, so the bound adds nothing to it.
const lbCreatesInFlight = 256

// createServices creates the phase's Services of names at once (at most
// lbCreatesInFlight in flight), with labels, and answers when each create
// was called and its error.
func createServices(ctx context.Context, kube kubernetes.Interface, names []string, labels map[string]string) ([]time.Time, []error) {
	created := make([]time.Time, len(names))
	errs := make([]error, len(names))
	gate := make(chan struct{})
	slots := make(chan struct{}, lbCreatesInFlight)
	var wg sync.WaitGroup
	for i, n := range names {
		wg.Go(func() {
			<-gate
			slots <- struct{}{}
			defer func() { <-slots }()
			svc := lbService(n)
			svc.Labels = labels
			created[i] = time.Now()
			_, errs[i] = kube.CoreV1().Services(lbNamespace).Create(ctx, svc, metav1.CreateOptions{})
		})
	}
	close(gate)
	wg.Wait()
	return created, errs
}

// lbService is the phase's Service: type LoadBalancer, one port, no class,
// no node ports (nothing here routes to them).
func lbService(name string) *corev1.Service {
	return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: lbNamespace, Name: name},
		Spec: corev1.ServiceSpec{Type: corev1.ServiceTypeLoadBalancer, Selector: map[string]string{"app": name}, AllocateLoadBalancerNodePorts: ptrTo(false),
			Ports: []corev1.ServicePort{{Port: 80, Protocol: corev1.ProtocolTCP}}}}
}

// ingressWatch records when each Service was first seen satisfied, and
// its address then.
type ingressWatch struct {
	mu   sync.Mutex
	at   map[string]time.Time
	addr map[string]string
	// pending are the Services seen unsatisfied (condition False).
	pending map[string]bool
	changed chan struct{}
}

func newIngressWatch() *ingressWatch {
	return &ingressWatch{at: map[string]time.Time{}, addr: map[string]string{}, pending: map[string]bool{}, changed: make(chan struct{}, 1)}
}

func (w *ingressWatch) follow(wi watch.Interface) {
	for ev := range wi.ResultChan() {
		svc, ok := ev.Object.(*corev1.Service)
		if !ok {
			continue
		}
		c := meta.FindStatusCondition(svc.Status.Conditions, lbipam.ConditionSatisfied)
		if c != nil && c.Status == metav1.ConditionFalse {
			w.mu.Lock()
			w.pending[svc.Name] = true
			w.mu.Unlock()
			w.signal()
			continue
		}
		if len(svc.Status.LoadBalancer.Ingress) == 0 || c == nil || c.Status != metav1.ConditionTrue {
			continue
		}
		now := time.Now()
		w.mu.Lock()
		if _, ok := w.at[svc.Name]; !ok {
			w.at[svc.Name], w.addr[svc.Name] = now, svc.Status.LoadBalancer.Ingress[0].IP
		}
		w.mu.Unlock()
		w.signal()
	}
}

func (w *ingressWatch) signal() {
	select {
	case w.changed <- struct{}{}:
	default:
	}
}

// wait waits until every name was seen satisfied, or bound passed.
func (w *ingressWatch) wait(ctx context.Context, names []string, bound time.Duration) bool {
	return w.waitFor(ctx, bound, func() bool {
		for _, n := range names {
			if _, ok := w.at[n]; !ok {
				return false
			}
		}
		return true
	})
}

// waitPending waits until every name was seen unsatisfied, or bound
// passed.
func (w *ingressWatch) waitPending(ctx context.Context, names []string, bound time.Duration) bool {
	return w.waitFor(ctx, bound, func() bool { return w.pendingCountLocked(names) == len(names) })
}

func (w *ingressWatch) pendingCount(names []string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.pendingCountLocked(names)
}

func (w *ingressWatch) pendingCountLocked(names []string) int {
	n := 0
	for _, name := range names {
		if w.pending[name] {
			n++
		}
	}
	return n
}

// waitFor waits until done (called with w.mu held) holds, or bound
// passed.
func (w *ingressWatch) waitFor(ctx context.Context, bound time.Duration, done func() bool) bool {
	t := time.NewTimer(bound)
	defer t.Stop()
	for {
		w.mu.Lock()
		all := done()
		w.mu.Unlock()
		if all {
			return true
		}
		select {
		case <-w.changed:
		case <-t.C:
			return false
		case <-ctx.Done():
			return false
		}
	}
}

func (w *ingressWatch) snapshot() (map[string]time.Time, map[string]string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	at, addr := make(map[string]time.Time, len(w.at)), make(map[string]string, len(w.addr))
	for k, v := range w.at {
		at[k] = v
	}
	for k, v := range w.addr {
		addr[k] = v
	}
	return at, addr
}

// teardownLBIPAM releases the phase's owners and deletes its pool from a
// shared database, once the server has stopped.
func teardownLBIPAM(ctx context.Context, admin *ipamclient.ClientWithResponses, names []string) error {
	for _, n := range names {
		resp, err := admin.ReleaseVIPsWithResponse(ctx, lbNamespace, n, &ipamclient.ReleaseVIPsParams{})
		if err != nil {
			return err
		}
		if err := statusError("release "+n, resp.StatusCode(), resp.Body); err != nil {
			return err
		}
	}
	for _, pool := range []string{lbPool, lbLatePool} {
		resp, err := admin.DeleteLBPoolWithResponse(ctx, pool, &ipamclient.DeleteLBPoolParams{})
		if err != nil {
			return err
		}
		if err := statusError("delete VIP pool "+pool, resp.StatusCode(), resp.Body); err != nil {
			return err
		}
	}
	return nil
}
