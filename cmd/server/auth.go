// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ipam-dev/ipam/internal/alloc"
	"github.com/ipam-dev/ipam/internal/api"
	"github.com/ipam-dev/ipam/internal/store"
)

// BootstrapTokenName names the admin token --bootstrap-token-file holds.
const BootstrapTokenName = "bootstrap-admin"

// authFlags adds the flags of authentication and rate limits.
func (c *config) authFlags(fs *flag.FlagSet) {
	fs.BoolVar(&c.DevNoAuth, "dev-no-auth", false, "with insecure-http: requests from loopback without credentials act as admin (make run); others still need a token")
	fs.StringVar(&c.BootstrapTokenFile, "bootstrap-token-file", "", "an admin token's secret: created there (mode 0600) when the file is missing, registered when the file holds one the database lacks")
	fs.DurationVar(&c.BootstrapTokenTTL, "bootstrap-token-ttl", 24*time.Hour, "lifetime of the bootstrap token")
	c.RateLimits = api.DefaultRateLimits
	fs.Var((*rateLimitFlag)(&c.RateLimits.Node), "node-rate-limit", "requests per second and burst of each node certificate, RATE,BURST; 0 = unlimited")
	fs.Var((*rateLimitFlag)(&c.RateLimits.Client), "client-rate-limit", "requests per second and burst of each token and operator certificate, RATE,BURST; 0 = unlimited")
	fs.Var((*rateLimitFlag)(&c.RateLimits.Anonymous), "anonymous-rate-limit", "requests per second and burst of each remote address without (valid) credentials, RATE,BURST; 0 = unlimited")
}

func (c config) validateAuth() []error {
	var errs []error
	if c.DevNoAuth && !c.InsecureHTTP {
		errs = append(errs, errors.New("dev-no-auth goes with insecure-http only"))
	}
	if c.BootstrapTokenTTL < alloc.MinTokenTTL || c.BootstrapTokenTTL > alloc.MaxTokenTTL {
		errs = append(errs, fmt.Errorf("bootstrap-token-ttl must be between %s and %s", alloc.MinTokenTTL, alloc.MaxTokenTTL))
	}
	return errs
}

// rateLimitFlag reads an api.RateLimit as RATE,BURST.
type rateLimitFlag api.RateLimit

func (f *rateLimitFlag) String() string { return api.RateLimit(*f).String() }

func (f *rateLimitFlag) Set(s string) error {
	l, err := api.ParseRateLimit(s)
	if err != nil {
		return err
	}
	*f = rateLimitFlag(l)
	return nil
}

// anonymousRole is the role of credential-less requests: admin on loopback
// with --dev-no-auth (api.Options.AnonymousLoopbackOnly), else none.
func anonymousRole(cfg config) alloc.Role {
	if cfg.DevNoAuth {
		return alloc.RoleAdmin
	}
	return ""
}

func logInsecure(log *slog.Logger, cfg config, addr string) {
	if cfg.DevNoAuth {
		log.Warn("serving plain HTTP; loopback requests without credentials act as admin (--dev-no-auth): for local development only", "addr", addr)
		return
	}
	log.Warn("serving plain HTTP: bearer tokens cross the network unencrypted; use TLS beyond one machine", "addr", addr)
}

// bootstrapToken makes --bootstrap-token-file hold a live admin token:
//   - no file: a new token (replacing an earlier bootstrap token) whose
//     secret is written to the file, mode 0600;
//   - a file whose secret the database lacks (a fresh database, or a
//     secret provisioned by a Kubernetes Secret shared by the replicas):
//     that secret is registered, so every replica agrees on it;
//   - a file whose token was revoked or expired: nothing is resurrected;
//     remove the file to get a new one.
//
// The secret is never logged.
func bootstrapToken(ctx context.Context, st *store.Store, cfg config, log *slog.Logger) error {
	path := cfg.BootstrapTokenFile
	if path == "" {
		return nil
	}
	spec := alloc.TokenSpec{Name: BootstrapTokenName, Role: alloc.RoleAdmin, TTL: cfg.BootstrapTokenTTL, CreatedBy: "bootstrap"}
	data, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		secret, hash := alloc.NewTokenSecret()
		t, err := st.ReplaceToken(ctx, spec, hash)
		if alloc.IsKind(err, alloc.KindConflict) {
			return fmt.Errorf("bootstrap token: another replica created %s at the same moment; give the replicas one file (a Secret) and start again", BootstrapTokenName)
		}
		if err != nil {
			return fmt.Errorf("bootstrap token: %w", err)
		}
		if err := writeSecretFile(path, secret); err != nil {
			return fmt.Errorf("bootstrap token: %w", err)
		}
		log.Info("created the bootstrap admin token", "file", path, "name", t.Name, "expiresAt", t.ExpiresAt)
		return nil
	case err != nil:
		return fmt.Errorf("bootstrap-token-file: %w", err)
	}
	secret := strings.TrimSpace(string(data))
	if !alloc.LooksLikeTokenSecret(secret) {
		return fmt.Errorf("bootstrap-token-file %s does not hold an API token (%s...)", path, alloc.TokenSecretPrefix)
	}
	hash := alloc.HashTokenSecret(secret)
	t, err := st.TokenBySecret(ctx, hash)
	if alloc.IsKind(err, alloc.KindNotFound) {
		t, err = st.ReplaceToken(ctx, spec, hash)
		if alloc.IsKind(err, alloc.KindConflict) {
			// Another replica registered the same file at the same time.
			t, err = st.TokenBySecret(ctx, hash)
		}
	}
	if err != nil {
		return fmt.Errorf("bootstrap token: %w", err)
	}
	if t.State != alloc.TokenActive {
		log.Warn("the bootstrap token is "+string(t.State)+"; remove the file to create a new one", "file", path, "name", t.Name)
		return nil
	}
	log.Info("bootstrap admin token in place", "file", path, "name", t.Name, "expiresAt", t.ExpiresAt)
	return nil
}

// writeSecretFile writes secret to path, readable by its owner only,
// through a temporary file so that a crash leaves no half-written token.
func writeSecretFile(path, secret string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(path), ".token-*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name()) // after the rename, a no-op
	if err := f.Chmod(0o600); err != nil {
		f.Close()
		return err
	}
	if _, err := f.WriteString(secret + "\n"); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}

// tokenCommand is `ipam-server token create|list|revoke`: API tokens
// managed directly in the database (IPAM_DATABASE_URL), for the first
// admin and for when no admin token is at hand. The secret of a created
// token is printed once, on its own line, and nowhere else.
func tokenCommand(ctx context.Context, args []string, getenv func(string) string, stdout io.Writer) error {
	const usage = "usage: ipam-server token create --name NAME [--role admin|operator|viewer] [--ttl 720h] | list | revoke --name NAME"
	if len(args) == 0 {
		return errors.New(usage)
	}
	verb := args[0]
	fs := flag.NewFlagSet("token "+verb, flag.ContinueOnError)
	dbURL := fs.String("database-url", getenv("IPAM_DATABASE_URL"), "PostgreSQL URL (default IPAM_DATABASE_URL)")
	name := fs.String("name", "", "the token's name, a DNS label")
	role := fs.String("role", string(alloc.RoleAdmin), "admin, operator or viewer")
	ttl := fs.Duration("ttl", alloc.DefaultTokenTTL, "lifetime, up to 366 days")
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	if *dbURL == "" {
		return errors.New("token needs --database-url or IPAM_DATABASE_URL (the embedded PostgreSQL's is logged at server start)")
	}
	st, err := store.Open(ctx, *dbURL, store.DefaultOptions())
	if err != nil {
		return err
	}
	defer st.Close()
	if _, err := st.Ready(ctx); err != nil {
		return fmt.Errorf("the database is not ready for tokens (run ipam-server migrate first): %w", err)
	}
	switch verb {
	case "create":
		r, err := alloc.ParseTokenRole("role", *role)
		if err != nil {
			return err
		}
		secret, hash := alloc.NewTokenSecret()
		t, err := st.CreateToken(ctx, alloc.TokenSpec{Name: *name, Role: r, TTL: *ttl, CreatedBy: "cli"}, hash)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "created token %s (role %s, expires %s); its secret, shown only now:\n%s\n",
			t.Name, t.Role, t.ExpiresAt.Format(time.RFC3339), secret)
		return nil
	case "revoke":
		if err := st.RevokeToken(ctx, *name); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "revoked token %s\n", *name)
		return nil
	case "list":
		w := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(w, "NAME\tROLE\tSTATE\tEXPIRES\tCREATED BY")
		page := alloc.Page{Limit: 1000}
		for {
			items, next, err := st.ListTokens(ctx, page)
			if err != nil {
				return err
			}
			for _, t := range items {
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\n", t.Name, t.Role, t.State, t.ExpiresAt.Format(time.RFC3339), t.CreatedBy)
			}
			if next == "" {
				return w.Flush()
			}
			page.Continue = next
		}
	}
	return errors.New(usage)
}
