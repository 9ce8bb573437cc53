// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/arm"
	azcloud "github.com/Azure/azure-sdk-for-go/sdk/azcore/cloud"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/azidentity"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"golang.org/x/time/rate"

	"github.com/ipam-dev/ipam/internal/alloc"
	"github.com/ipam-dev/ipam/internal/cloud"
	"github.com/ipam-dev/ipam/internal/cloud/aws"
	"github.com/ipam-dev/ipam/internal/cloud/azure"
	"github.com/ipam-dev/ipam/internal/cloud/capacity"
	"github.com/ipam-dev/ipam/internal/store"
)

// startCloud starts the cloud capacity workers of cfg.CloudProvider: a
// pass over its cloud pools cfg.CloudInterval after the last one ended,
// by the replica that holds the store's cloud lock, every request behind
// one token bucket (taken where the SDK sends it, so that a call of
// several requests, a page and a retry each take one), every call
// bounded by cfg.CloudCallTimeout. It answers a channel closed once the
// workers stopped with ctx; nil when no provider is configured.
func startCloud(ctx context.Context, cfg config, st *store.Store, log *slog.Logger, meter metric.Meter) (<-chan struct{}, error) {
	if cfg.CloudProvider == "" {
		return nil, nil
	}
	m, err := newCloudMetrics(meter, cfg.CloudProvider)
	if err != nil {
		return nil, err
	}
	// The wrappers bound and observe the calls; the bucket is the
	// clients' (cloud.Budget), so they take none of it themselves.
	wrap := []cloud.Option{cloud.WithObserver(m), cloud.WithCallTimeout(cfg.CloudCallTimeout)}
	bucket := rate.NewLimiter(rate.Limit(cfg.CloudQPS), cfg.CloudBurst)
	w := &capacity.Worker{Store: st, Provider: alloc.CloudProvider(cfg.CloudProvider), Log: log,
		Tags: map[string]string{cloud.TagCluster: cfg.CloudCluster}, Parallel: cfg.CloudParallel}
	switch w.Provider {
	case alloc.CloudAWS:
		awsCfg, err := awsconfig.LoadDefaultConfig(ctx, awsconfig.WithRegion(cfg.AWSRegion))
		if err != nil {
			return nil, fmt.Errorf("AWS configuration: %w", err)
		}
		client := ec2.NewFromConfig(awsCfg, func(o *ec2.Options) {
			if cfg.AWSEndpoint != "" {
				o.BaseEndpoint = &cfg.AWSEndpoint
			}
			// EC2's requests only: the credential's (STS, IMDS) count
			// against other limits.
			var next cloud.Doer = awshttp.NewBuildableClient()
			if o.HTTPClient != nil {
				next = o.HTTPClient
			}
			o.HTTPClient = aws.SafeBodies(cloud.NewBudget(next, bucket))
		})
		p := aws.New(client, aws.Options{})
		w.Cloud, w.Interfaces = cloud.NewLimited(p, nil, wrap...), cloud.NewLimitedInterfaces(p, nil, wrap...)
		w.Inventory = cloud.NewLimitedInventory(p, nil, wrap...)
	case alloc.CloudAzure:
		opts, err := cfg.azureClientOptions()
		if err != nil {
			return nil, err
		}
		// Workload identity, managed identity or a client secret, as the
		// AZURE_* variables say.
		cred, err := azidentity.NewDefaultAzureCredential(&azidentity.DefaultAzureCredentialOptions{ClientOptions: opts,
			DisableInstanceDiscovery: cfg.AzureAuthorityHost != ""})
		if err != nil {
			return nil, fmt.Errorf("azure credential: %w", err)
		}
		// One bucket for the subscription's ARM requests, network's and
		// compute's alike; Entra ID's token requests take none.
		armOpts := opts
		var next cloud.Doer = opts.Transport
		if next == nil {
			next = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
		}
		armOpts.Transport = cloud.NewBudget(next, bucket)
		p, err := azure.New(cfg.AzureSubscription, cred, &arm.ClientOptions{ClientOptions: armOpts})
		if err != nil {
			return nil, err
		}
		w.Cloud = cloud.NewLimited(p, nil, wrap...)
		w.Inventory = cloud.NewLimitedInventory(p, nil, wrap...)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		// The next try comes a whole interval after this one ended, not at
		// once after a long pass: the lock is free that long, so a standby
		// replica, trying every interval too, takes it then (the holder's
		// calls may be what hangs).
		t := time.NewTimer(cfg.CloudInterval)
		defer t.Stop()
		var collect capacity.CollectSchedule
		for {
			ran, err := st.WithCloudLock(ctx, w.Pass)
			switch {
			case err != nil && ctx.Err() == nil:
				m.pass(ctx, "failed")
				log.Warn("cloud capacity pass", "provider", cfg.CloudProvider, "err", err)
			case ran:
				m.pass(ctx, "ok")
				log.Debug("cloud capacity pass done", "provider", cfg.CloudProvider)
			case err == nil:
				m.pass(ctx, "standby") // another replica holds the lock
			}
			// Leaked interfaces are collected by the leader only, and only
			// on a cloud that creates them (AWS).
			if collect.Due(ran, time.Now()) && w.Interfaces != nil {
				_, cerr := st.WithCloudLock(ctx, func(ctx context.Context) error {
					deleted, err := cloud.CollectLeaked(ctx, w.Interfaces, w.Tags, cloud.DefaultLeakAge, time.Now())
					if len(deleted) > 0 {
						log.Info("cloud capacity: leaked interfaces deleted", "provider", cfg.CloudProvider, "interfaces", deleted)
					}
					return err
				})
				if cerr != nil && ctx.Err() == nil {
					log.Warn("cloud capacity: collecting leaked interfaces", "provider", cfg.CloudProvider, "err", cerr)
				}
			}
			t.Reset(cfg.CloudInterval)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	log.Info("cloud capacity workers on", "provider", cfg.CloudProvider, "interval", cfg.CloudInterval.String(), "qps", cfg.CloudQPS,
		"burst", cfg.CloudBurst, "callTimeout", cfg.CloudCallTimeout.String(), "parallel", cfg.CloudParallel)
	return done, nil
}

// azureClouds are the clouds --azure-cloud names.
var azureClouds = map[string]azcloud.Configuration{
	"public": azcloud.AzurePublic, "china": azcloud.AzureChina, "usgovernment": azcloud.AzureGovernment,
}

// azureClientOptions are the options of the Azure credential and
// clients: the cloud of --azure-cloud, or the endpoint and authority of
// --azure-endpoint and --azure-authority-host (with the public cloud's
// ARM audience), trusting --azure-ca-file's CAs too.
func (c config) azureClientOptions() (policy.ClientOptions, error) {
	var opts policy.ClientOptions
	opts.Cloud = azureClouds[c.AzureCloud]
	if c.AzureEndpoint != "" {
		arm := opts.Cloud.Services[azcloud.ResourceManager]
		opts.Cloud = azcloud.Configuration{ActiveDirectoryAuthorityHost: c.AzureAuthorityHost,
			Services: map[azcloud.ServiceName]azcloud.ServiceConfiguration{azcloud.ResourceManager: {Endpoint: c.AzureEndpoint, Audience: arm.Audience}}}
	}
	if c.AzureCAFile != "" {
		pem, err := os.ReadFile(c.AzureCAFile)
		if err != nil {
			return opts, fmt.Errorf("azure-ca-file: %w", err)
		}
		pool, err := x509.SystemCertPool()
		if err != nil {
			pool = x509.NewCertPool()
		}
		if !pool.AppendCertsFromPEM(pem) {
			return opts, fmt.Errorf("azure-ca-file %s holds no PEM certificate", c.AzureCAFile)
		}
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
		opts.Transport = &http.Client{Transport: tr}
	}
	return opts, nil
}

// cloudMetrics are the workers' instruments, named as Cilium's operator
// names its EC2 ones (ec2_api_duration_seconds, ..._rate_limit_...):
// every cloud call by operation and outcome with its duration, the time
// it waited for the bucket, and the passes by outcome.
type cloudMetrics struct {
	provider attribute.KeyValue
	duration metric.Float64Histogram
	waited   metric.Float64Histogram
	passes   metric.Int64Counter
}

var cloudBuckets = []float64{0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}

func newCloudMetrics(meter metric.Meter, provider string) (*cloudMetrics, error) {
	m := &cloudMetrics{provider: attribute.String("provider", provider)}
	var err, e error
	m.duration, e = meter.Float64Histogram("ipam_cloud_api_duration_seconds",
		metric.WithDescription("Cloud API calls of the capacity workers by operation and outcome (ok, a cloud.Kind such as throttled, timeout past --cloud-call-timeout, or canceled when the bucket kept it from the cloud), with their duration."),
		metric.WithExplicitBucketBoundaries(cloudBuckets...))
	err = errors.Join(err, e)
	m.waited, e = meter.Float64Histogram("ipam_cloud_api_rate_limit_duration_seconds",
		metric.WithDescription("Time each cloud API call's requests waited for the shared token bucket (--cloud-qps, --cloud-burst), one token a request."),
		metric.WithExplicitBucketBoundaries(cloudBuckets...))
	err = errors.Join(err, e)
	m.passes, e = meter.Int64Counter("ipam_cloud_passes", metric.WithUnit("{pass}"),
		metric.WithDescription("Capacity worker passes by outcome: ok, failed (the log says why), standby (another replica holds the lock)."))
	err = errors.Join(err, e)
	if err != nil {
		return nil, fmt.Errorf("cloud metrics: %w", err)
	}
	// Every outcome's series from the start, at 0.
	for _, o := range []string{"ok", "failed", "standby"} {
		m.passes.Add(context.Background(), 0, metric.WithAttributes(m.provider, attribute.String("outcome", o)))
	}
	return m, nil
}

// pass counts a pass of outcome.
func (m *cloudMetrics) pass(ctx context.Context, outcome string) {
	m.passes.Add(ctx, 1, metric.WithAttributes(m.provider, attribute.String("outcome", outcome)))
}

// ObserveCall records one call (cloud.CallObserver).
func (m *cloudMetrics) ObserveCall(op string, waited, took time.Duration, err error) {
	outcome := "ok"
	switch {
	case err != nil && took == 0:
		outcome = "canceled"
	case errors.Is(err, context.DeadlineExceeded):
		outcome = "timeout" // --cloud-call-timeout, or the pass's end
	case err != nil:
		outcome = cloud.KindOf(err).String()
	}
	ctx := context.Background()
	operation := attribute.String("operation", op)
	m.waited.Record(ctx, waited.Seconds(), metric.WithAttributes(m.provider, operation))
	m.duration.Record(ctx, took.Seconds(), metric.WithAttributes(m.provider, operation, attribute.String("outcome", outcome)))
}

// validateCloud checks the cloud flags.
func (c config) validateCloud() []error {
	var errs []error
	switch alloc.CloudProvider(c.CloudProvider) {
	case "":
		return nil
	case alloc.CloudAWS:
		if c.AWSRegion == "" {
			errs = append(errs, errors.New("cloud-provider=aws needs aws-region"))
		}
	case alloc.CloudAzure:
		if c.AzureSubscription == "" {
			errs = append(errs, errors.New("cloud-provider=azure needs azure-subscription"))
		}
		if _, ok := azureClouds[c.AzureCloud]; !ok {
			errs = append(errs, fmt.Errorf("azure-cloud must be public, china or usgovernment, not %q", c.AzureCloud))
		}
		for _, u := range []struct{ flag, value string }{{"azure-endpoint", c.AzureEndpoint}, {"azure-authority-host", c.AzureAuthorityHost}} {
			if p, err := url.Parse(u.value); u.value != "" && (err != nil || p.Scheme != "https" || p.Host == "") {
				errs = append(errs, fmt.Errorf("%s must be an https URL, not %q", u.flag, u.value))
			}
		}
		if (c.AzureEndpoint == "") != (c.AzureAuthorityHost == "") {
			errs = append(errs, errors.New("azure-endpoint and azure-authority-host go together (a private cloud's ARM and Entra ID)"))
		}
	default:
		errs = append(errs, fmt.Errorf("cloud-provider must be aws or azure, not %q", c.CloudProvider))
	}
	if c.CloudInterval <= 0 {
		errs = append(errs, errors.New("cloud-interval must be positive"))
	}
	if c.CloudQPS <= 0 || c.CloudBurst < 1 {
		errs = append(errs, errors.New("cloud-qps must be positive and cloud-burst at least 1"))
	}
	if c.CloudCallTimeout <= 0 {
		errs = append(errs, errors.New("cloud-call-timeout must be positive"))
	}
	if c.CloudParallel < 1 {
		errs = append(errs, errors.New("cloud-parallel must be at least 1"))
	}
	if c.CloudCluster == "" {
		errs = append(errs, errors.New("cloud-cluster must name the cluster (it tags the interfaces the workers create)"))
	}
	return errs
}
