// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/ipam-dev/ipam/internal/alloc"
	"github.com/ipam-dev/ipam/internal/api"
	"github.com/ipam-dev/ipam/internal/cilium"
	"github.com/ipam-dev/ipam/internal/cloud"
	"github.com/ipam-dev/ipam/internal/cloud/capacity"
	"github.com/ipam-dev/ipam/internal/lbipam"
	"github.com/ipam-dev/ipam/internal/store"
)

// config is every setting of the server. Each flag has an IPAM_* environment
// variable of the same name (flag "lease-expiry" <- IPAM_LEASE_EXPIRY); a
// flag given on the command line wins over the environment.
type config struct {
	DatabaseURL       string
	DataDir           string
	Listen            string
	LogLevel          slog.Level
	LeaseExpiry       time.Duration
	Cooldown          time.Duration
	AutoRegisterNodes bool
	GCInterval        time.Duration
	ShutdownTimeout   time.Duration
	MaxBodyBytes      int64
	MaxConns          int
	BatchWriters      int
	TLSCertFile       string
	TLSKeyFile        string
	ClientCAFile      string
	InsecureHTTP      bool
	Migrate           bool
	DefaultPool       string
	BlockReleaseDelay time.Duration
	// BlockTopUp runs the store's top-up (store.Options.TopUp), at most
	// one pass every BlockTopUpInterval.
	BlockTopUp         bool
	BlockTopUpInterval time.Duration
	UsageSampleEvery   time.Duration
	// Tracing is on when the OTEL_* variables ask for spans (not a flag).
	Tracing bool
	// MetricsPrefix goes before the Cilium-named metrics, joined by "_".
	MetricsPrefix string
	// UsageMetricsRefresh is the most often a scrape reads the usage report.
	UsageMetricsRefresh time.Duration
	// DurabilityInterval is how often the database's durability settings
	// are read (durability.go).
	DurabilityInterval time.Duration
	Kubeconfig         string
	KubeInCluster      bool
	// ClusterSpace is the address space of the cluster of Kubeconfig or
	// KubeInCluster: its Pods' metadata, its CiliumNodes and its Services
	// are that space's, so that several clusters share one database
	// without cross-talk, even with the same node names.
	ClusterSpace string
	// Cilium operator role (internal/cilium); off when CiliumIPAMMode is "".
	CiliumIPAMMode        string
	CiliumLeaseNamespace  string
	CiliumKubeQPS         float64
	CiliumKubeBurst       int
	CiliumWorkers         int
	ExcessIPReleaseDelay  time.Duration
	AWSReleaseExcessIPs   bool
	CiliumNodesGCInterval time.Duration
	// CiliumClusterPoolToMultiPoolMigration is Cilium's
	// enable-cluster-pool-to-multi-pool-migration (multi-pool mode only).
	CiliumClusterPoolToMultiPoolMigration bool
	// LB IPAM controller (internal/lbipam); off unless LBIPAM.
	LBIPAM          bool
	LBIPAMClasses   string
	LBIPAMDefault   string
	NodeIPAM        bool
	LBIPAMMirror    bool
	LBIPAMFamilies  string
	LBIPAMLeaseNS   string
	LBIPAMResync    time.Duration
	ReconcileMinAge time.Duration
	StickyRetention time.Duration
	// Authentication and limits (auth.go).
	DevNoAuth          bool
	BootstrapTokenFile string
	BootstrapTokenTTL  time.Duration
	RateLimits         api.RateLimits
	HistoryRetention   time.Duration
	// Pprof serves the Go profiler at /debug/pprof/ to admins.
	Pprof bool
	// UI serves the read-only web view at /ui/ (internal/ui).
	UI bool
	// Admission control (api.Admission): 0 in-flight means as many as
	// database connections, 0 queue four times the in-flight limit.
	MaxInFlight    int
	AdmissionQueue int
	AdmissionWait  time.Duration
	// MaxPerCaller bounds one caller's requests in progress (0: half of
	// the in-flight limit); BodyTimeout bounds the reading of a body.
	MaxPerCaller int
	BodyTimeout  time.Duration
	// Cloud capacity workers (cloud.go); off when CloudProvider is "".
	CloudProvider     string
	CloudInterval     time.Duration
	CloudQPS          float64
	CloudBurst        int
	CloudCallTimeout  time.Duration
	CloudParallel     int
	CloudCluster      string
	AWSRegion         string
	AWSEndpoint       string
	AzureSubscription string
	// AzureCloud is the Azure cloud (public, china, usgovernment);
	// AzureEndpoint and AzureAuthorityHost override its ARM endpoint and
	// Entra ID host (a private cloud such as Azure Stack Hub, a test
	// server), AzureCAFile adds the CAs their certificates chain to.
	AzureCloud, AzureEndpoint, AzureAuthorityHost, AzureCAFile string
}

// admission is the API's admission control: MaxInFlight (default: the
// database connections) requests at once, AdmissionQueue (default four
// times as many) waiting for at most AdmissionWait.
func (c config) admission() api.Admission {
	conns := c.MaxConns
	if conns == 0 {
		conns = int(store.DefaultMaxConns())
	}
	a := api.DefaultAdmission(conns)
	if c.MaxInFlight > 0 {
		a = api.DefaultAdmission(c.MaxInFlight)
	}
	if c.AdmissionQueue > 0 {
		a.Queue = c.AdmissionQueue
	}
	a.Wait = c.AdmissionWait
	if c.MaxPerCaller > 0 {
		a.PerCaller = c.MaxPerCaller
	}
	a.BodyTimeout = c.BodyTimeout
	return a
}

// metricsPrefixRE is what a Prometheus metric name may start with.
var metricsPrefixRE = regexp.MustCompile(`^[a-zA-Z_][a-zA-Z0-9_]*$`)

func (c config) Validate() error {
	var errs []error
	if c.Listen == "" {
		errs = append(errs, errors.New("listen address is empty"))
	}
	if c.LeaseExpiry <= 0 {
		errs = append(errs, errors.New("lease-expiry must be positive"))
	}
	if c.Cooldown < 0 {
		errs = append(errs, errors.New("cooldown must not be negative"))
	}
	if c.GCInterval <= 0 {
		errs = append(errs, errors.New("gc-interval must be positive"))
	}
	if c.ShutdownTimeout <= 0 {
		errs = append(errs, errors.New("shutdown-timeout must be positive"))
	}
	if c.MaxBodyBytes <= 0 {
		errs = append(errs, errors.New("max-body-bytes must be positive"))
	}
	if c.MaxConns < 0 {
		errs = append(errs, errors.New("max-conns must not be negative"))
	}
	if (c.TLSCertFile == "") != (c.TLSKeyFile == "") {
		errs = append(errs, errors.New("tls-cert-file and tls-key-file go together"))
	}
	if c.ClientCAFile != "" && c.TLSCertFile == "" {
		errs = append(errs, errors.New("client-ca-file needs tls-cert-file and tls-key-file"))
	}
	if c.InsecureHTTP && (c.TLSCertFile != "" || c.ClientCAFile != "") {
		errs = append(errs, errors.New("insecure-http cannot go with tls-cert-file or client-ca-file"))
	}
	if c.BlockReleaseDelay < 0 {
		errs = append(errs, errors.New("block-release-delay must not be negative"))
	}
	if c.BlockTopUpInterval <= 0 {
		errs = append(errs, errors.New("block-top-up-interval must be positive"))
	}
	if c.ReconcileMinAge < 0 {
		errs = append(errs, errors.New("reconcile-min-age must not be negative"))
	}
	if c.StickyRetention < time.Second || c.StickyRetention > alloc.MaxStickyRetention {
		errs = append(errs, fmt.Errorf("sticky-retention must be from 1s to %s", alloc.MaxStickyRetention))
	}
	if c.UsageSampleEvery <= 0 {
		errs = append(errs, errors.New("usage-sample-interval must be positive"))
	}
	if c.UsageMetricsRefresh <= 0 {
		errs = append(errs, errors.New("usage-metrics-refresh must be positive"))
	}
	if c.DurabilityInterval <= 0 {
		errs = append(errs, errors.New("durability-interval must be positive"))
	}
	if c.MetricsPrefix != "" && !metricsPrefixRE.MatchString(c.MetricsPrefix) {
		errs = append(errs, fmt.Errorf("metrics-prefix %q is not a Prometheus metric name prefix ([a-zA-Z_][a-zA-Z0-9_]*)", c.MetricsPrefix))
	}
	if c.MaxInFlight < 0 {
		errs = append(errs, errors.New("max-in-flight must not be negative"))
	}
	errs = append(errs, c.validateCloud()...)
	if c.AdmissionQueue < 0 {
		errs = append(errs, errors.New("admission-queue must not be negative"))
	}
	if c.AdmissionWait <= 0 {
		errs = append(errs, errors.New("admission-wait must be positive"))
	}
	if c.MaxPerCaller < 0 {
		errs = append(errs, errors.New("max-per-caller must not be negative"))
	}
	if c.BodyTimeout <= 0 {
		errs = append(errs, errors.New("body-timeout must be positive"))
	}
	if c.HistoryRetention < 0 {
		errs = append(errs, errors.New("history-retention must not be negative"))
	}
	if err := alloc.ValidateLabelName("cluster-space", c.ClusterSpace); err != nil {
		errs = append(errs, err)
	}
	if c.Kubeconfig != "" && c.KubeInCluster {
		errs = append(errs, errors.New("kubeconfig and kube-in-cluster exclude each other"))
	}
	if (c.NodeIPAM || c.LBIPAMMirror) && !c.LBIPAM {
		errs = append(errs, errors.New("node-ipam and lbipam-mirror run in the lbipam controller: set lbipam too"))
	}
	if c.LBIPAM {
		if c.Kubeconfig == "" && !c.KubeInCluster {
			errs = append(errs, errors.New("lbipam needs kubeconfig or kube-in-cluster"))
		}
		if _, _, err := lbipamFamilies(c.LBIPAMFamilies); err != nil {
			errs = append(errs, fmt.Errorf("lbipam-families: %w", err))
		}
		switch c.LBIPAMDefault {
		case lbipam.DefaultLBIPAM, lbipam.DefaultNone:
		case lbipam.DefaultNodeIPAM:
			if !c.NodeIPAM {
				errs = append(errs, errors.New("lbipam-default-ipam nodeipam needs node-ipam"))
			}
		default:
			errs = append(errs, fmt.Errorf("lbipam-default-ipam %q: want lbipam, nodeipam or none", c.LBIPAMDefault))
		}
		if c.LBIPAMResync < time.Second {
			errs = append(errs, fmt.Errorf("lbipam-resync %v: at least 1s", c.LBIPAMResync))
		}
		if c.CiliumKubeQPS < cilium.MinKubeQPS || c.CiliumKubeBurst < cilium.MinKubeBurst {
			errs = append(errs, fmt.Errorf("lbipam: cilium-kube-qps must be at least %d and cilium-kube-burst at least %d (the leader Lease's renewals take 1/s and 2 of them)",
				cilium.MinKubeQPS, cilium.MinKubeBurst))
		}
	}
	if c.CiliumClusterPoolToMultiPoolMigration && cilium.Mode(c.CiliumIPAMMode) != cilium.ModeMultiPool {
		errs = append(errs, errors.New("cilium-cluster-pool-to-multi-pool-migration needs cilium-ipam-mode=multi-pool"))
	}
	if c.CiliumIPAMMode != "" {
		if _, err := cilium.ParseMode(c.CiliumIPAMMode); err != nil {
			errs = append(errs, fmt.Errorf("cilium-ipam-mode: %w", err))
		}
		if c.Kubeconfig == "" && !c.KubeInCluster {
			errs = append(errs, errors.New("cilium-ipam-mode needs kubeconfig or kube-in-cluster"))
		}
		if c.CiliumKubeQPS < cilium.MinKubeQPS || c.CiliumKubeBurst < cilium.MinKubeBurst {
			errs = append(errs, fmt.Errorf("cilium-kube-qps must be at least %d and cilium-kube-burst at least %d (the leader Lease's renewals take 1/s and 2 of them)",
				cilium.MinKubeQPS, cilium.MinKubeBurst))
		}
		if c.CiliumNodesGCInterval < 0 {
			errs = append(errs, errors.New("cilium-nodes-gc-interval must not be negative"))
		}
		if c.CiliumWorkers <= 0 {
			errs = append(errs, errors.New("cilium-workers must be positive"))
		}
		if c.ExcessIPReleaseDelay <= 0 {
			errs = append(errs, errors.New("excess-ip-release-delay must be positive"))
		}
	}
	errs = append(errs, c.validateAuth()...)
	if c.DatabaseURL == "" && c.DataDir == "" {
		errs = append(errs, errors.New("data-dir is needed for the embedded PostgreSQL when no database-url is set"))
	}
	return errors.Join(errs...)
}

// envName maps a flag name to its environment variable.
func envName(flagName string) string {
	return "IPAM_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// parseConfig reads flags for one subcommand, with environment defaults.
func parseConfig(name string, args []string, getenv func(string) string) (config, error) {
	c := config{}
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	level := "info"
	fs.StringVar(&c.DatabaseURL, "database-url", "", "PostgreSQL URL; empty starts a private PostgreSQL under data-dir")
	fs.StringVar(&c.DataDir, "data-dir", defaultDataDir(), "directory of the embedded PostgreSQL (used when database-url is empty)")
	fs.StringVar(&c.Listen, "listen", ":8080", "HTTP listen address")
	fs.StringVar(&level, "log-level", level, "debug, info, warn or error")
	fs.DurationVar(&c.LeaseExpiry, "lease-expiry", 10*time.Minute, "pending leases are released after this unless confirmed")
	fs.DurationVar(&c.Cooldown, "cooldown", 30*time.Second, "a released address is not leased again before this; 0 allowed")
	fs.BoolVar(&c.AutoRegisterNodes, "auto-register-nodes", true, "register an unknown node on its first lease request")
	fs.DurationVar(&c.GCInterval, "gc-interval", 10*time.Second, "how often expired leases are released and cooled addresses purged")
	fs.DurationVar(&c.ShutdownTimeout, "shutdown-timeout", 20*time.Second, "how long in-flight requests may finish on shutdown")
	fs.Int64Var(&c.MaxBodyBytes, "max-body-bytes", 1<<20, "request body limit")
	fs.IntVar(&c.MaxConns, "max-conns", 0, "database connections per replica; 0 = max(32, 8 x CPUs)")
	fs.IntVar(&c.BatchWriters, "batch-writers", 0, "batches of concurrent lease and release statements in flight at once, each one transaction; 0 = 1, -1 = every statement its own transaction")
	fs.BoolVar(&c.Migrate, "migrate", true, "apply migrations at start (under an advisory lock)")
	fs.StringVar(&c.TLSCertFile, "tls-cert-file", "", "serve HTTPS with this certificate (PEM); empty serves plain HTTP")
	fs.StringVar(&c.TLSKeyFile, "tls-key-file", "", "the key of tls-cert-file (PEM)")
	fs.StringVar(&c.ClientCAFile, "client-ca-file", "", "require client certificates signed by this CA (mutual TLS); node certificates are then confined to their node")
	fs.BoolVar(&c.InsecureHTTP, "insecure-http", false, "serve plain HTTP without authentication: local development only")
	fs.StringVar(&c.DefaultPool, "default-pool", "default", "the pool of Pods no annotation, request or selector places (Cilium's ipam-default-ip-pool)")
	fs.DurationVar(&c.BlockReleaseDelay, "block-release-delay", 3*time.Minute, "how long a multi-pool block stays completely free above a node's need before it returns to the pool; with cilium-ipam-mode=multi-pool, how long a block a Cilium agent gave back stays its node's")
	fs.BoolVar(&c.BlockTopUp, "block-top-up", true, "carve a node's multi-pool blocks up to its need (neededIPCeil of its demand and pre-allocation) in the background right after its allocations, so that allocations do not carve; false leaves that to the pass every gc-interval")
	fs.DurationVar(&c.BlockTopUpInterval, "block-top-up-interval", 100*time.Millisecond, "the least time between two top-up passes: the allocations of the nodes in between are read in one statement")
	fs.DurationVar(&c.UsageSampleEvery, "usage-sample-interval", time.Minute, "how often pool usage is sampled for the exhaustion forecast")
	fs.BoolVar(&c.Pprof, "pprof", false, "serve the Go profiler at /debug/pprof/ on the API listener, to admins only")
	fs.BoolVar(&c.UI, "ui", true, "serve the read-only web view at /ui/ on the API listener: its pages are public and hold no data, which they read from /v1 with the browser's credentials (a client certificate, or a token signed in at /ui/session as a cookie that authorizes reads only)")
	fs.StringVar(&c.MetricsPrefix, "metrics-prefix", "", `prefix of the Cilium-named metrics (ipam_available_ips, ...), joined by "_": "cilium_operator" makes them cilium_operator_ipam_available_ips`)
	fs.DurationVar(&c.UsageMetricsRefresh, "usage-metrics-refresh", 15*time.Second, "the most often a metrics scrape reads node and pool usage from the database")
	fs.DurationVar(&c.DurabilityInterval, "durability-interval", 30*time.Second, "how often the database's durability (a synchronous standby attached or not) is read, logged when it changes, and exported as ipam_db_synchronous")
	fs.StringVar(&c.CloudProvider, "cloud-provider", "", "run the cloud capacity workers of this cloud (aws or azure) for its cloud pools: one replica at a time (a PostgreSQL advisory lock); empty runs none")
	fs.DurationVar(&c.CloudInterval, "cloud-interval", 10*time.Second, "the time between two passes of the cloud capacity workers")
	fs.Float64Var(&c.CloudQPS, "cloud-qps", cloud.DefaultQPS, "cloud API requests per second, every worker's together, each page and retry one (Cilium's limit-ipam-api-qps)")
	fs.IntVar(&c.CloudBurst, "cloud-burst", cloud.DefaultBurst, "cloud API requests at once above cloud-qps (Cilium's limit-ipam-api-burst)")
	fs.DurationVar(&c.CloudCallTimeout, "cloud-call-timeout", cloud.DefaultCallTimeout, "the longest a cloud call may take, its SDK's retries and its waits for the bucket included: a hung call ends then, and so does the pass and the cloud lock it holds")
	fs.IntVar(&c.CloudParallel, "cloud-parallel", capacity.DefaultParallel, "how many nodes a cloud capacity pass reads and serves at a time (Cilium's parallel-alloc-workers, 50 there); every request still takes a token of the one bucket")
	fs.StringVar(&c.CloudCluster, "cloud-cluster", "ipam", "the cluster's name, tagged on the interfaces the workers create (ipam-dev.io/cluster); the leak collector touches only those")
	fs.StringVar(&c.AWSRegion, "aws-region", "", "the AWS region of the nodes (credentials come from the SDK's default chain: environment, web identity, instance role)")
	fs.StringVar(&c.AWSEndpoint, "aws-endpoint", "", "an EC2 endpoint other than the region's (a VPC endpoint, a test server)")
	fs.StringVar(&c.AzureSubscription, "azure-subscription", "", "the Azure subscription of the nodes (credentials: workload identity, managed identity or client secret, as the AZURE_* variables say)")
	fs.StringVar(&c.AzureCloud, "azure-cloud", "public", "the Azure cloud: public, china or usgovernment")
	fs.StringVar(&c.AzureEndpoint, "azure-endpoint", "", "an Azure Resource Manager endpoint other than the cloud's (a private cloud, a test server); needs azure-authority-host")
	fs.StringVar(&c.AzureAuthorityHost, "azure-authority-host", "", "the Microsoft Entra ID host that issues azure-endpoint's tokens (https://...); its instance discovery is skipped")
	fs.StringVar(&c.AzureCAFile, "azure-ca-file", "", "PEM file of CAs to trust, beside the system's, for Azure's endpoints (a private cloud's)")
	fs.DurationVar(&c.HistoryRetention, "history-retention", 30*24*time.Hour, "how long address history events are kept; 0 keeps them forever")
	fs.StringVar(&c.Kubeconfig, "kubeconfig", "", "read Pod and namespace labels and annotations for pool selection, and where Pods run for the node certificates' rules, from this cluster")
	fs.BoolVar(&c.KubeInCluster, "kube-in-cluster", false, "as kubeconfig, with the Pod's service account (in-cluster config)")
	fs.StringVar(&c.ClusterSpace, "cluster-space", alloc.DefaultSpace, "the address space of the cluster of kubeconfig or kube-in-cluster: the Cilium operator, LB IPAM and the Pod lookups work in it alone, so that clusters sharing the database stay apart (it must exist: POST /v1/spaces)")
	fs.StringVar(&c.CiliumIPAMMode, "cilium-ipam-mode", "", "play Cilium's operator for this IPAM mode (crd, multi-pool or cluster-pool) in the cluster of kubeconfig or kube-in-cluster; empty: off")
	fs.StringVar(&c.CiliumLeaseNamespace, "cilium-lease-namespace", "kube-system", "namespace of the Lease the replicas elect the one Cilium operator with (deploy/kubernetes sets the Pod's own)")
	fs.Float64Var(&c.CiliumKubeQPS, "cilium-kube-qps", 20, "the Cilium operator's steady request rate to the API server (client-side limit)")
	fs.IntVar(&c.CiliumKubeBurst, "cilium-kube-burst", 40, "the Cilium operator's request burst to the API server")
	fs.IntVar(&c.CiliumWorkers, "cilium-workers", cilium.DefaultWorkers, "CiliumNodes the operator reconciles in parallel")
	fs.DurationVar(&c.CiliumNodesGCInterval, "cilium-nodes-gc-interval", cilium.DefaultNodesGCInterval, "how often the operator looks for CiliumNodes whose Node is gone; it deletes one found so at least this long before (Cilium's nodes-gc-interval); 0: never")
	fs.BoolVar(&c.CiliumClusterPoolToMultiPoolMigration, "cilium-cluster-pool-to-multi-pool-migration", false, "with cilium-ipam-mode=multi-pool, move every CiliumNode's spec.ipam.podCIDRs to spec.ipam.pools.allocated of default-pool (its blocks with it, a cluster-pool default pool turning multi-pool) before allocating, as Cilium's enable-cluster-pool-to-multi-pool-migration")
	fs.BoolVar(&c.AWSReleaseExcessIPs, "aws-release-excess-ips", false, "let the operator give back the excess addresses of nodes of AWS cloud pools, as Cilium's aws-release-excess-ips (off, as there); nodes of Azure pools never do, nodes of other pools always do")
	fs.DurationVar(&c.ExcessIPReleaseDelay, "excess-ip-release-delay", cilium.DefaultExcessIPReleaseDelay, "how long an address stays excess on a node before the operator marks it for release (Cilium's excess-ip-release-delay; crd mode)")
	fs.BoolVar(&c.LBIPAM, "lbipam", false, "play Cilium's LB IPAM for the LoadBalancer Services of the cluster of kubeconfig or kube-in-cluster: VIPs from the cluster space's VIP pools (leader-elected)")
	fs.StringVar(&c.LBIPAMClasses, "lbipam-classes", lbipam.ClassL2+","+lbipam.ClassBGP, "loadBalancerClass values LB IPAM serves, comma-separated (Services of other classes are left alone)")
	fs.StringVar(&c.LBIPAMDefault, "lbipam-default-ipam", lbipam.DefaultLBIPAM, "who serves Services without a loadBalancerClass, as Cilium's defaultLBServiceIPAM: lbipam, nodeipam (needs node-ipam) or none")
	fs.BoolVar(&c.LBIPAMMirror, "lbipam-mirror", false, "with lbipam, write the cluster space's VIP pools as CiliumLoadBalancerIPPool objects (with Cilium's conditions) and its CIDR groups as CiliumCIDRGroup objects, read-only, and import the cluster's own objects as pools and groups they own; Cilium's own LB IPAM must be off (Helm enableLBIPAM=false)")
	fs.BoolVar(&c.NodeIPAM, "node-ipam", false, "with lbipam, publish node addresses for the Services of class io.cilium/node (Cilium's nodeIPAM.enabled; reads Nodes and EndpointSlices)")
	fs.StringVar(&c.LBIPAMFamilies, "lbipam-families", "ipv4", "the cluster's families for Services' ipFamilyPolicy: ipv4, ipv6 or ipv4,ipv6")
	fs.StringVar(&c.LBIPAMLeaseNS, "lbipam-lease-namespace", "kube-system", "namespace of the Lease the replicas elect the one LB IPAM controller with")
	fs.DurationVar(&c.LBIPAMResync, "lbipam-resync", time.Minute, "how often LB IPAM looks at every Service again: a safety net, since the database announces every change that can serve a waiting Service (at least 1s)")
	fs.DurationVar(&c.ReconcileMinAge, "reconcile-min-age", store.DefaultReconcileMinAge, "a reconcile (CNI GC) never releases a lease younger than this, whatever its list says")
	fs.DurationVar(&c.StickyRetention, "sticky-retention", alloc.DefaultStickyRetention, "how long a released address stays bound to its workload identity when the request names no retention")
	fs.IntVar(&c.MaxInFlight, "max-in-flight", 0, "API requests served at once per replica; more wait in line (see admission-queue); 0 = as many as database connections (max-conns)")
	fs.IntVar(&c.AdmissionQueue, "admission-queue", 0, "requests that may wait for a slot; more are answered 503 with Retry-After at once; 0 = 4 x max-in-flight")
	fs.DurationVar(&c.AdmissionWait, "admission-wait", api.DefaultAdmission(1).Wait, "the longest a request waits for a slot before it is answered 503 with Retry-After")
	fs.IntVar(&c.MaxPerCaller, "max-per-caller", 0, "API requests one caller (a node, a token, an operator certificate) may have in progress at once, from reading its body to the answer; more wait for one of its own for at most admission-wait, then are answered 429; 0 = half of max-in-flight")
	fs.DurationVar(&c.BodyTimeout, "body-timeout", api.DefaultBodyTimeout, "how long a request body may take to arrive; it is read before the request waits for a slot, and a body not there in time is answered 408")
	c.authFlags(fs)

	// Environment first, so explicit flags override it.
	var envErrs []error
	fs.VisitAll(func(f *flag.Flag) {
		if v := getenv(envName(f.Name)); v != "" {
			if err := f.Value.Set(v); err != nil {
				envErrs = append(envErrs, fmt.Errorf("%s=%q: %w", envName(f.Name), v, err))
			}
		}
	})
	if err := errors.Join(envErrs...); err != nil {
		return c, err
	}
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	if err := c.LogLevel.UnmarshalText([]byte(level)); err != nil {
		return c, fmt.Errorf("log-level: %w", err)
	}
	return c, c.Validate()
}

// defaultDataDir is where the embedded PostgreSQL lives when no database
// URL is set: /var/lib/ipam for root (PostgreSQL then runs as the postgres
// user, who cannot enter /root), else the user's cache directory.
func defaultDataDir() string {
	if os.Geteuid() == 0 {
		return "/var/lib/ipam"
	}
	if d, err := os.UserCacheDir(); err == nil {
		return d + "/ipam"
	}
	return os.TempDir() + "/ipam-" + strconv.Itoa(os.Getuid())
}
