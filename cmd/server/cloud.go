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
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/ec2"
	"golang.org/x/time/rate"

	"github.com/ipam-dev/ipam/internal/alloc"
	"github.com/ipam-dev/ipam/internal/cloud"
	"github.com/ipam-dev/ipam/internal/cloud/aws"
	"github.com/ipam-dev/ipam/internal/cloud/azure"
	"github.com/ipam-dev/ipam/internal/cloud/capacity"
	"github.com/ipam-dev/ipam/internal/store"
)

// startCloud starts the cloud capacity workers of cfg.CloudProvider: a
// pass over its cloud pools every cfg.CloudInterval, by the replica that
// holds the store's cloud lock, every call behind one token bucket. It
// answers a channel closed once the workers stopped with ctx; nil when no
// provider is configured.
func startCloud(ctx context.Context, cfg config, st *store.Store, log *slog.Logger) (<-chan struct{}, error) {
	if cfg.CloudProvider == "" {
		return nil, nil
	}
	bucket := rate.NewLimiter(rate.Limit(cfg.CloudQPS), cfg.CloudBurst)
	w := &capacity.Worker{Store: st, Provider: alloc.CloudProvider(cfg.CloudProvider), Log: log,
		Tags: map[string]string{cloud.TagCluster: cfg.CloudCluster}}
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
		})
		p := aws.New(client, aws.Options{})
		w.Cloud, w.Interfaces = cloud.NewLimited(p, bucket), cloud.NewLimitedInterfaces(p, bucket)
		w.Inventory = cloud.NewLimitedInventory(p, bucket)
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
		p, err := azure.New(cfg.AzureSubscription, cred, &arm.ClientOptions{ClientOptions: opts})
		if err != nil {
			return nil, err
		}
		w.Cloud = cloud.NewLimited(p, bucket)
		w.Inventory = cloud.NewLimitedInventory(p, bucket)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(cfg.CloudInterval)
		defer t.Stop()
		var collect capacity.CollectSchedule
		for {
			ran, err := st.WithCloudLock(ctx, w.Pass)
			switch {
			case err != nil && ctx.Err() == nil:
				log.Warn("cloud capacity pass", "provider", cfg.CloudProvider, "err", err)
			case ran:
				log.Debug("cloud capacity pass done", "provider", cfg.CloudProvider)
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
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	log.Info("cloud capacity workers on", "provider", cfg.CloudProvider, "interval", cfg.CloudInterval.String(), "qps", cfg.CloudQPS, "burst", cfg.CloudBurst)
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
	if c.CloudCluster == "" {
		errs = append(errs, errors.New("cloud-cluster must name the cluster (it tags the interfaces the workers create)"))
	}
	return errs
}
