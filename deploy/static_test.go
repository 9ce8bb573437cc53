// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package deploy

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"
	"github.com/moby/buildkit/frontend/dockerfile/command"
	dockerfile "github.com/moby/buildkit/frontend/dockerfile/parser"
)

// serverEnv lists the environment variables cmd/server reads: IPAM_ and its
// flag's name in upper case (flag "lease-expiry" <- IPAM_LEASE_EXPIRY). The
// compose file, the manifests and the chart may give the server only these
// (TestServerEnvNamesAreServerFlags keeps each a flag of the server).
var serverEnv = []string{
	"IPAM_DATABASE_URL",
	"IPAM_LISTEN",
	"IPAM_DATA_DIR",
	"IPAM_LOG_LEVEL",
	"IPAM_LEASE_EXPIRY",
	"IPAM_COOLDOWN",
	"IPAM_AUTO_REGISTER_NODES",
	"IPAM_GC_INTERVAL",
	"IPAM_SHUTDOWN_TIMEOUT",
	"IPAM_MAX_BODY_BYTES",
	"IPAM_MAX_CONNS",
	"IPAM_MIGRATE",
	"IPAM_TLS_CERT_FILE",
	"IPAM_TLS_KEY_FILE",
	"IPAM_CLIENT_CA_FILE",
	"IPAM_INSECURE_HTTP",
	"IPAM_DEFAULT_POOL",
	"IPAM_BLOCK_RELEASE_DELAY",
	"IPAM_USAGE_SAMPLE_INTERVAL",
	"IPAM_HISTORY_RETENTION",
	"IPAM_KUBECONFIG",
	"IPAM_KUBE_IN_CLUSTER",
	"IPAM_CLUSTER_SPACE",
	"IPAM_METRICS_PREFIX",
	"IPAM_USAGE_METRICS_REFRESH",
	"IPAM_RECONCILE_MIN_AGE",
	"IPAM_STICKY_RETENTION",
	"IPAM_PPROF",
	"IPAM_DEV_NO_AUTH",
	"IPAM_BOOTSTRAP_TOKEN_FILE",
	"IPAM_BOOTSTRAP_TOKEN_TTL",
	"IPAM_NODE_RATE_LIMIT",
	"IPAM_CLIENT_RATE_LIMIT",
	"IPAM_ANONYMOUS_RATE_LIMIT",
	"IPAM_CILIUM_IPAM_MODE",
	"IPAM_CILIUM_LEASE_NAMESPACE",
	"IPAM_CILIUM_KUBE_QPS",
	"IPAM_CILIUM_KUBE_BURST",
	"IPAM_CILIUM_WORKERS",
	"IPAM_EXCESS_IP_RELEASE_DELAY",
	"IPAM_AWS_RELEASE_EXCESS_IPS",
	"IPAM_CILIUM_CLUSTER_POOL_TO_MULTI_POOL_MIGRATION",
	"IPAM_BATCH_WRITERS",
	"IPAM_BLOCK_TOP_UP",
	"IPAM_BLOCK_TOP_UP_INTERVAL",
	"IPAM_DURABILITY_INTERVAL",
	"IPAM_MAX_IN_FLIGHT",
	"IPAM_ADMISSION_QUEUE",
	"IPAM_ADMISSION_WAIT",
	"IPAM_MAX_PER_CALLER",
	"IPAM_BODY_TIMEOUT",
	"IPAM_LBIPAM",
	"IPAM_LBIPAM_CLASSES",
	"IPAM_LBIPAM_DEFAULT_IPAM",
	"IPAM_LBIPAM_FAMILIES",
	"IPAM_LBIPAM_LEASE_NAMESPACE",
	"IPAM_LBIPAM_MIRROR",
	"IPAM_LBIPAM_RESYNC",
	"IPAM_NODE_IPAM",
	"IPAM_CLOUD_PROVIDER",
	"IPAM_CLOUD_CLUSTER",
	"IPAM_CLOUD_INTERVAL",
	"IPAM_CLOUD_QPS",
	"IPAM_CLOUD_BURST",
	"IPAM_AWS_REGION",
	"IPAM_AWS_ENDPOINT",
	"IPAM_AZURE_SUBSCRIPTION",
	"IPAM_AZURE_CLOUD",
	"IPAM_AZURE_ENDPOINT",
	"IPAM_AZURE_AUTHORITY_HOST",
	"IPAM_AZURE_CA_FILE",
}

// serverFlagNames returns the flags cmd/server defines (fs.XxxVar(p, NAME,
// ...) and fs.Var(v, NAME, ...)), read from its source.
func serverFlagNames(t *testing.T) []string {
	t.Helper()
	dir := filepath.Join(repoRoot(t), "cmd", "server")
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	fset := token.NewFileSet()
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), ".go") || strings.HasSuffix(e.Name(), "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, e.Name()), nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) < 2 {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok || !strings.HasSuffix(sel.Sel.Name, "Var") {
				return true
			}
			if x, ok := sel.X.(*ast.Ident); !ok || x.Name != "fs" {
				return true
			}
			if lit, ok := call.Args[1].(*ast.BasicLit); ok && lit.Kind == token.STRING {
				if name, err := strconv.Unquote(lit.Value); err == nil {
					names = append(names, name)
				}
			}
			return true
		})
	}
	if len(names) < 20 {
		t.Fatalf("found only the flags %v in cmd/server", names)
	}
	return names
}

// Every variable the manifests and the chart may give the server is one
// of its flags: a misspelt name would be ignored by the server, silently.
func TestServerEnvNamesAreServerFlags(t *testing.T) {
	var env []string
	for _, f := range serverFlagNames(t) {
		env = append(env, "IPAM_"+strings.ToUpper(strings.ReplaceAll(f, "-", "_")))
	}
	for _, name := range serverEnv {
		if !slices.Contains(env, name) {
			t.Errorf("serverEnv lists %s, which is no flag of cmd/server", name)
		}
	}
}

const (
	serverService   = "server"
	databaseService = "postgres"
)

// repoRoot is the module's root: tests run in this package's directory.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

func readFile(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// ---------------------------------------------------------------------------
// docker-compose.yaml

// composeEnv is the environment docker-compose.yaml is interpolated with.
// The README and docs/operations.md run it as `docker compose up --build`
// with no .env file and no variable set, so it is empty: a ${VAR} the file
// comes to use must be set here, and where the docs say, too.
var composeEnv = map[string]string{}

// loadCompose loads the compose file at path with the Compose
// specification's own loader: its JSON schema (no unknown key, a known
// depends_on condition, ...), interpolation from env alone (neither the
// caller's environment nor a .env file), normalization, and its consistency
// checks (an image or a build, defined dependencies, networks and volumes).
func loadCompose(path string, env map[string]string) (*types.Project, error) {
	var list []string
	for k, v := range env {
		list = append(list, k+"="+v)
	}
	opts, err := cli.NewProjectOptions([]string{path},
		cli.WithWorkingDirectory(filepath.Dir(path)),
		cli.WithEnv(list))
	if err != nil {
		return nil, err
	}
	return opts.LoadProject(context.Background())
}

// checkCompose reports every problem the loader leaves to this project:
// the services it needs, build contexts, health checks to wait for, and the
// server's environment.
func checkCompose(p *types.Project) error {
	var errs []error
	for _, name := range []string{databaseService, serverService} {
		if _, ok := p.Services[name]; !ok {
			errs = append(errs, fmt.Errorf("service %q is missing", name))
		}
	}
	for _, name := range slices.Sorted(maps.Keys(p.Services)) {
		s := p.Services[name]
		if s.Build != nil {
			if err := checkBuild(*s.Build); err != nil {
				errs = append(errs, fmt.Errorf("service %q: %w", name, err))
			}
		}
		if s.HealthCheck != nil {
			if err := checkHealthcheck(*s.HealthCheck); err != nil {
				errs = append(errs, fmt.Errorf("service %q: %w", name, err))
			}
		}
		errs = append(errs, checkDependsOn(p, name))
	}
	if db, ok := p.Services[databaseService]; ok && db.HealthCheck == nil {
		errs = append(errs, fmt.Errorf("service %q has no healthcheck", databaseService))
	}
	if srv, ok := p.Services[serverService]; ok {
		if srv.Build == nil {
			errs = append(errs, fmt.Errorf("service %q is not built from this repository", serverService))
		}
		errs = append(errs, checkServerEnv(p))
	}
	return errors.Join(errs...)
}

// checkBuild checks that the build context, which the loader made absolute,
// is a directory holding the named Dockerfile.
func checkBuild(b types.BuildConfig) error {
	if fi, err := os.Stat(b.Context); err != nil || !fi.IsDir() {
		return fmt.Errorf("build context %q is not a directory", b.Context)
	}
	dockerfile := cmp.Or(b.Dockerfile, "Dockerfile")
	if !filepath.IsAbs(dockerfile) {
		dockerfile = filepath.Join(b.Context, dockerfile)
	}
	if fi, err := os.Stat(dockerfile); err != nil || !fi.Mode().IsRegular() {
		return fmt.Errorf("build context %q has no file %q", b.Context, b.Dockerfile)
	}
	return nil
}

// checkHealthcheck checks that a healthcheck runs a command: the loader
// accepts a test of "NONE", a lone "CMD" and disable: true.
func checkHealthcheck(h types.HealthCheckConfig) error {
	if h.Disable || len(h.Test) < 2 || !slices.Contains([]string{"CMD", "CMD-SHELL"}, h.Test[0]) {
		return fmt.Errorf("healthcheck test %v is not [CMD|CMD-SHELL, command...]", []string(h.Test))
	}
	return nil
}

// checkDependsOn checks what the loader does not: a service that waits for
// a dependency to be healthy waits for one with a healthcheck (Compose would
// otherwise fail at up). The loader reports undefined dependencies and
// cycles.
func checkDependsOn(p *types.Project, name string) error {
	var errs []error
	deps := p.Services[name].DependsOn
	for _, dep := range slices.Sorted(maps.Keys(deps)) {
		target, ok := p.Services[dep]
		if ok && deps[dep].Condition == types.ServiceConditionHealthy && target.HealthCheck == nil {
			errs = append(errs, fmt.Errorf("service %q waits for %q to be healthy, but it has no healthcheck", name, dep))
		}
	}
	return errors.Join(errs...)
}

// checkServerEnv checks the server's environment: only variables the server
// reads, and a database URL that names a service the server waits for.
func checkServerEnv(p *types.Project) error {
	var errs []error
	srv := p.Services[serverService]
	for _, k := range slices.Sorted(maps.Keys(srv.Environment)) {
		switch {
		case !strings.HasPrefix(k, "IPAM_"):
			errs = append(errs, fmt.Errorf("service %q: environment variable %q does not start with IPAM_", serverService, k))
		case !slices.Contains(serverEnv, k):
			errs = append(errs, fmt.Errorf("service %q: environment variable %q is not one the server reads (%v)", serverService, k, serverEnv))
		}
	}
	dbURL := envValue(srv, "IPAM_DATABASE_URL")
	if dbURL == "" {
		return errors.Join(append(errs, fmt.Errorf("service %q: IPAM_DATABASE_URL is unset, and the image has no PostgreSQL", serverService))...)
	}
	u, err := url.Parse(dbURL)
	switch {
	case err != nil:
		errs = append(errs, fmt.Errorf("service %q: IPAM_DATABASE_URL: %w", serverService, err))
	case u.Scheme != "postgres" && u.Scheme != "postgresql":
		errs = append(errs, fmt.Errorf("service %q: IPAM_DATABASE_URL scheme %q is not postgres", serverService, u.Scheme))
	default:
		if _, ok := p.Services[u.Hostname()]; !ok {
			errs = append(errs, fmt.Errorf("service %q: IPAM_DATABASE_URL host %q is not a service", serverService, u.Hostname()))
		} else if _, waits := srv.DependsOn[u.Hostname()]; !waits {
			errs = append(errs, fmt.Errorf("service %q does not depend on its database %q", serverService, u.Hostname()))
		}
	}
	return errors.Join(errs...)
}

// envValue is the value s's environment gives name, or "" (also for a name
// listed without a value, which the loader leaves nil).
func envValue(s types.ServiceConfig, name string) string {
	if v := s.Environment[name]; v != nil {
		return *v
	}
	return ""
}

// ---------------------------------------------------------------------------
// Dockerfile

// instruction is one Dockerfile instruction with its continuation lines
// joined.
type instruction struct {
	Line int    // where it starts, from 1
	Cmd  string // upper case: FROM, RUN, ...
	Args string // the words after Cmd, one space apart
}

// parseDockerfile parses src with BuildKit's Dockerfile parser, the one
// docker build runs: parser directives, continuation lines, comments within
// them and heredoc bodies as Docker reads them. It adds two refusals: an
// instruction Docker does not know, which the parser passes on and the
// build refuses, and any warning of the parser (an empty continuation line,
// which Docker says will become an error).
func parseDockerfile(src string) ([]instruction, error) {
	res, err := dockerfile.Parse(strings.NewReader(src))
	if err != nil {
		return nil, err
	}
	var errs []error
	for _, w := range res.Warnings {
		errs = append(errs, errors.New(w.Short))
	}
	var out []instruction
	for _, n := range res.AST.Children {
		words := strings.Fields(n.Original)
		if _, ok := command.Commands[strings.ToLower(n.Value)]; !ok || len(words) == 0 {
			errs = append(errs, fmt.Errorf("line %d: unknown instruction %q", n.StartLine, strings.Join(words[:min(1, len(words))], "")))
			continue
		}
		out = append(out, instruction{Line: n.StartLine, Cmd: strings.ToUpper(n.Value), Args: strings.Join(words[1:], " ")})
	}
	return out, errors.Join(errs...)
}

// stage is one FROM ... of a Dockerfile, with what the checks need.
type stage struct {
	name, image string
	user        string
	entrypoint  *instruction
	cmd         *instruction
	expose      []string
}

// dockerfileSummary is what checkDockerfile learnt, for cross-checks.
type dockerfileSummary struct {
	stages     []stage
	buildPaths []string // the packages `go build` builds
}

func (d dockerfileSummary) final() stage { return d.stages[len(d.stages)-1] }

// checkDockerfile reports every problem with instrs; root is the build
// context, where the built packages must exist.
func checkDockerfile(instrs []instruction, root string) (dockerfileSummary, error) {
	var sum dockerfileSummary
	var errs []error
	globalArgs := map[string]string{}
	for _, in := range instrs {
		if len(sum.stages) == 0 && in.Cmd != "FROM" {
			if in.Cmd != "ARG" {
				errs = append(errs, fmt.Errorf("line %d: %s before the first FROM", in.Line, in.Cmd))
			} else {
				k, v, _ := strings.Cut(in.Args, "=")
				globalArgs[k] = v
			}
			continue
		}
		words := strings.Fields(in.Args)
		switch in.Cmd {
		case "FROM":
			st, err := parseFrom(words, globalArgs, sum.stages)
			if err != nil {
				errs = append(errs, fmt.Errorf("line %d: %w", in.Line, err))
			}
			sum.stages = append(sum.stages, st)
			continue
		case "COPY", "ADD":
			for _, w := range words {
				if from, ok := strings.CutPrefix(w, "--from="); ok && !earlierStage(from, sum.stages[:len(sum.stages)-1]) {
					errs = append(errs, fmt.Errorf("line %d: %s --from=%s names no earlier stage", in.Line, in.Cmd, from))
				}
			}
		case "RUN":
			if p, ok := goBuildPackage(in.Args); ok {
				sum.buildPaths = append(sum.buildPaths, p)
				if err := checkMainPackage(root, p); err != nil {
					errs = append(errs, fmt.Errorf("line %d: %w", in.Line, err))
				}
			}
		}
		cur := &sum.stages[len(sum.stages)-1]
		switch in.Cmd {
		case "USER":
			cur.user = in.Args
		case "ENTRYPOINT":
			cur.entrypoint = &in
		case "CMD":
			cur.cmd = &in
		case "EXPOSE":
			cur.expose = append(cur.expose, words...)
		}
	}
	if len(sum.stages) == 0 {
		return sum, errors.Join(append(errs, errors.New("no FROM"))...)
	}
	final := sum.final()
	switch u, _, _ := strings.Cut(final.user, ":"); {
	case u == "root" || u == "0":
		errs = append(errs, fmt.Errorf("the final stage runs as %q", final.user))
	case u == "" && !strings.HasSuffix(final.image, ":nonroot"):
		errs = append(errs, fmt.Errorf("the final stage has no USER and its image %q is not a :nonroot one", final.image))
	}
	if final.entrypoint == nil {
		errs = append(errs, errors.New("the final stage has no ENTRYPOINT"))
	} else if err := checkExecForm(*final.entrypoint); err != nil {
		errs = append(errs, err)
	}
	if final.cmd != nil {
		if err := checkExecForm(*final.cmd); err != nil {
			errs = append(errs, err)
		}
	}
	if len(sum.buildPaths) == 0 {
		errs = append(errs, errors.New("no RUN ... go build ./... builds the server"))
	}
	return sum, errors.Join(errs...)
}

// parseFrom parses FROM [--flags] IMAGE [AS NAME], checking that IMAGE is an
// earlier stage or a pinned image: a tag other than latest, or a digest.
func parseFrom(words []string, args map[string]string, earlier []stage) (stage, error) {
	for len(words) > 0 && strings.HasPrefix(words[0], "--") {
		words = words[1:]
	}
	if len(words) == 0 {
		return stage{}, errors.New("FROM without an image")
	}
	st := stage{image: os.Expand(words[0], func(k string) string { return args[k] })}
	if len(words) == 3 && strings.EqualFold(words[1], "AS") {
		st.name = strings.ToLower(words[2])
	} else if len(words) != 1 {
		return st, fmt.Errorf("FROM %s: want IMAGE [AS NAME]", strings.Join(words, " "))
	}
	if st.name != "" && slices.ContainsFunc(earlier, func(e stage) bool { return e.name == st.name }) {
		return st, fmt.Errorf("stage name %q used twice", st.name)
	}
	if st.image == "scratch" || slices.ContainsFunc(earlier, func(e stage) bool { return e.name == st.image }) {
		return st, nil
	}
	return st, checkImageTag(st.image)
}

// checkImageTag checks that image is pinned: a digest, or a tag other than
// latest. (A registry's port, as in localhost:5000/img, is not a tag.)
func checkImageTag(image string) error {
	if strings.Contains(image, "@sha256:") {
		return nil
	}
	_, tag, hasTag := strings.Cut(image[strings.LastIndex(image, "/")+1:], ":")
	switch {
	case !hasTag || tag == "":
		return fmt.Errorf("image %q has no tag", image)
	case tag == "latest":
		return fmt.Errorf("image %q uses the moving tag latest", image)
	}
	return nil
}

// earlierStage reports whether from (a name or an index) is one of stages.
func earlierStage(from string, stages []stage) bool {
	if n, err := strconv.Atoi(from); err == nil {
		return n >= 0 && n < len(stages)
	}
	return slices.ContainsFunc(stages, func(s stage) bool { return s.name == strings.ToLower(from) })
}

// goBuildPackage returns the package path (./...) that a RUN command's
// go build builds.
func goBuildPackage(run string) (string, bool) {
	_, after, ok := strings.Cut(run, "go build")
	if !ok {
		return "", false
	}
	after, _, _ = strings.Cut(after, "&&")
	var pkg string
	for _, w := range strings.Fields(after) {
		if strings.HasPrefix(w, "./") {
			pkg = w
		}
	}
	return pkg, pkg != ""
}

// checkMainPackage checks that root/pkg is a directory of Go files of
// package main.
func checkMainPackage(root, pkg string) error {
	dir := filepath.Join(root, filepath.FromSlash(pkg))
	files, _ := filepath.Glob(filepath.Join(dir, "*.go"))
	n := 0
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		n++
		af, err := parser.ParseFile(token.NewFileSet(), f, nil, parser.PackageClauseOnly)
		if err != nil {
			return fmt.Errorf("go build %s: %w", pkg, err)
		}
		if af.Name.Name != "main" {
			return fmt.Errorf("go build %s: %s is package %s, not main", pkg, filepath.Base(f), af.Name.Name)
		}
	}
	if n == 0 {
		return fmt.Errorf("go build %s: no Go files in %s", pkg, dir)
	}
	return nil
}

// checkExecForm checks that an ENTRYPOINT or CMD is in exec (JSON) form,
// so that the process gets signals directly rather than through a shell.
func checkExecForm(in instruction) error {
	var argv []string
	if err := json.Unmarshal([]byte(in.Args), &argv); err != nil || len(argv) == 0 || argv[0] == "" {
		return fmt.Errorf("line %d: %s %s is not in JSON exec form [\"/binary\", ...]", in.Line, in.Cmd, in.Args)
	}
	return nil
}

// checkServerPorts cross-checks compose and Dockerfile: each container port
// the compose file publishes for the server is EXPOSEd by the image, and is
// the port of IPAM_LISTEN.
func checkServerPorts(p *types.Project, d dockerfileSummary) error {
	var errs []error
	srv := p.Services[serverService]
	_, listenPort, err := splitHostPort(cmp.Or(envValue(srv, "IPAM_LISTEN"), ":8080"))
	if err != nil {
		errs = append(errs, fmt.Errorf("IPAM_LISTEN: %w", err))
	}
	exposed := d.final().expose
	for _, port := range srv.Ports {
		container := strconv.FormatUint(uint64(port.Target), 10)
		if !slices.Contains(exposed, container) && !slices.Contains(exposed, container+"/"+cmp.Or(port.Protocol, "tcp")) {
			errs = append(errs, fmt.Errorf("compose publishes container port %s, which the image does not EXPOSE (%v)", container, exposed))
		}
		if listenPort != "" && container != listenPort {
			errs = append(errs, fmt.Errorf("compose publishes container port %s, but the server listens on %s", container, listenPort))
		}
	}
	return errors.Join(errs...)
}

func splitHostPort(addr string) (host, port string, err error) {
	i := strings.LastIndex(addr, ":")
	if i < 0 {
		return "", "", fmt.Errorf("%q has no port", addr)
	}
	return addr[:i], addr[i+1:], nil
}

// ---------------------------------------------------------------------------
// .dockerignore

// ignoredBy returns the .dockerignore pattern that excludes path (slash
// separated, relative to the context), or "" when path is sent. A pattern
// matches a path or any of its parent directories; a later !pattern
// re-includes. (Docker also knows **, which these checks do not need.)
func ignoredBy(dockerignore, path string) string {
	excludedBy := ""
	for _, line := range strings.Split(dockerignore, "\n") {
		pat := strings.TrimSpace(line)
		if pat == "" || strings.HasPrefix(pat, "#") {
			continue
		}
		negate := strings.HasPrefix(pat, "!")
		pat = strings.TrimPrefix(strings.TrimPrefix(pat, "!"), "/")
		pat = strings.TrimSuffix(filepath.ToSlash(filepath.Clean(pat)), "/")
		for p := path; p != "." && p != "/"; p = filepath.ToSlash(filepath.Dir(p)) {
			if ok, _ := filepath.Match(pat, p); ok {
				if negate {
					excludedBy = ""
				} else {
					excludedBy = line
				}
				break
			}
		}
	}
	return excludedBy
}

// ---------------------------------------------------------------------------
// Tests of this repository's files

func TestComposeFile(t *testing.T) {
	p, err := loadCompose(filepath.Join(repoRoot(t), "docker-compose.yaml"), composeEnv)
	if err != nil {
		t.Fatalf("docker-compose.yaml: %v", err)
	}
	if err := checkCompose(p); err != nil {
		t.Errorf("docker-compose.yaml:\n%v", err)
	}
}

func TestDockerfile(t *testing.T) {
	root := repoRoot(t)
	instrs, err := parseDockerfile(readFile(t, filepath.Join(root, "Dockerfile")))
	if err != nil {
		t.Fatalf("Dockerfile: %v", err)
	}
	sum, err := checkDockerfile(instrs, root)
	if err != nil {
		t.Fatalf("Dockerfile:\n%v", err)
	}
	if !slices.Contains(sum.buildPaths, "./cmd/server") {
		t.Errorf("Dockerfile builds %v; want ./cmd/server", sum.buildPaths)
	}
	p, err := loadCompose(filepath.Join(root, "docker-compose.yaml"), composeEnv)
	if err != nil {
		t.Fatal(err)
	}
	if err := checkServerPorts(p, sum); err != nil {
		t.Errorf("docker-compose.yaml and Dockerfile disagree:\n%v", err)
	}
}

func TestDockerignoreKeepsBuildInputs(t *testing.T) {
	ignore := readFile(t, filepath.Join(repoRoot(t), ".dockerignore"))
	for _, p := range []string{"go.mod", "go.sum", "cmd/server/main.go", "internal/store/store.go", "migrations/embed.go", "api/openapi.yaml"} {
		if pat := ignoredBy(ignore, p); pat != "" {
			t.Errorf(".dockerignore pattern %q leaves %s out of the build context", pat, p)
		}
	}
	for _, p := range []string{".git/HEAD", "server"} {
		if ignoredBy(ignore, p) == "" {
			t.Errorf(".dockerignore sends %s to the build context", p)
		}
	}
}

// TestDockerComposeConfig lets docker compose validate the file as well,
// which needs the CLI's compose plugin but no engine. Without them the
// static checks above are the only ones.
func TestDockerComposeConfig(t *testing.T) {
	docker, err := exec.LookPath("docker")
	if err != nil {
		t.Log("no docker CLI: `docker compose config` not run; the static checks stand alone")
		return
	}
	if out, err := exec.Command(docker, "compose", "version").CombinedOutput(); err != nil {
		t.Logf("docker CLI without the compose plugin (%s): `docker compose config` not run; the static checks stand alone",
			strings.TrimSpace(string(out)))
		return
	}
	cmd := exec.Command(docker, "compose", "-f", "docker-compose.yaml", "config", "-q")
	cmd.Dir = repoRoot(t)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Errorf("docker compose config: %v\n%s", err, out)
	}
}

// ---------------------------------------------------------------------------
// Tests that each check can fail

const goodCompose = `
name: ipam
services:
  postgres:
    image: postgres:15
    healthcheck:
      test: ["CMD-SHELL", "pg_isready -U ipam"]
    volumes:
      - pgdata:/var/lib/postgresql/data
  server:
    build:
      context: .
      dockerfile: Dockerfile
    depends_on:
      postgres:
        condition: service_healthy
    environment:
      IPAM_DATABASE_URL: postgres://ipam:ipam@postgres:5432/ipam?sslmode=disable
      IPAM_LISTEN: ":8080"
    ports:
      - "8080:8080"
volumes:
  pgdata:
`

// fakeRepo is a build context with a Dockerfile and a main package at
// cmd/server.
func fakeRepo(t *testing.T) string {
	t.Helper()
	root := t.TempDir()
	if err := os.MkdirAll(filepath.Join(root, "cmd", "server"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(root, "cmd", "lib"), 0o755); err != nil {
		t.Fatal(err)
	}
	for path, content := range map[string]string{
		"Dockerfile":         goodDockerfile,
		"cmd/server/main.go": "package main\n\nfunc main() {}\n",
		"cmd/lib/lib.go":     "package lib\n",
	} {
		if err := os.WriteFile(filepath.Join(root, path), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

// wantError fails t unless err is what want says: nil when want is "",
// else an error whose text contains want. call names the call checked.
func wantError(t *testing.T, call string, err error, want string) {
	t.Helper()
	if want == "" {
		if err != nil {
			t.Fatalf("%s: %v; want no error", call, err)
		}
		return
	}
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("%s: %v; want an error containing %q", call, err, want)
	}
}

// edit applies old -> new replacements to src, failing the test when an old
// text is absent, so that no case silently tests the unchanged input.
func edit(t *testing.T, src string, replacements ...string) string {
	t.Helper()
	for i := 0; i+1 < len(replacements); i += 2 {
		if !strings.Contains(src, replacements[i]) {
			t.Fatalf("edit: %q not in input", replacements[i])
		}
		src = strings.Replace(src, replacements[i], replacements[i+1], 1)
	}
	return src
}

// loadComposeIn writes src as root's docker-compose.yaml and loads it.
func loadComposeIn(t *testing.T, root, src string, env map[string]string) (*types.Project, error) {
	t.Helper()
	path := filepath.Join(root, "docker-compose.yaml")
	if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	return loadCompose(path, env)
}

// Each case breaks goodCompose once; the loader or checkCompose must say
// what is wrong.
func TestCheckComposeFindsProblems(t *testing.T) {
	tests := []struct {
		name    string
		edits   []string          // old, new, ...
		env     map[string]string // the environment it is loaded with
		wantErr string            // "" means valid
	}{
		{name: "valid", wantErr: ""},
		{name: "list forms of depends_on and environment",
			edits: []string{
				"depends_on:\n      postgres:\n        condition: service_healthy", "depends_on: [postgres]",
				"environment:\n      IPAM_DATABASE_URL: ", "environment:\n      - IPAM_DATABASE_URL=",
				`      IPAM_LISTEN: ":8080"`, `      - IPAM_LISTEN=:8080`,
			}},
		{name: "healthcheck as a string", edits: []string{`test: ["CMD-SHELL", "pg_isready -U ipam"]`, `test: pg_isready -U ipam`}},
		{name: "required variable set", env: map[string]string{"IPAM_PORT": "8080"},
			edits: []string{`IPAM_LISTEN: ":8080"`, `IPAM_LISTEN: ":${IPAM_PORT:?set the port}"`}},

		// What the Compose specification's loader rejects.
		{name: "unknown key", edits: []string{"    depends_on:", "    dependson:"}, wantErr: "services.server.dependson"},
		{name: "unknown condition", edits: []string{"condition: service_healthy", "condition: healthy"},
			wantErr: "depends_on.postgres.condition value must be one of"},
		{name: "depends on itself", edits: []string{"      postgres:\n        condition", "      server:\n        condition"},
			wantErr: "dependency cycle detected: server -> server"},
		{name: "required variable missing", edits: []string{`IPAM_LISTEN: ":8080"`, `IPAM_LISTEN: ":${IPAM_PORT:?set the port}"`},
			wantErr: "required variable IPAM_PORT is missing a value: set the port"},
		{name: "depends on undefined", edits: []string{"      postgres:\n        condition", "      db:\n        condition"},
			wantErr: `depends on undefined service "db"`},
		{name: "host port out of range", edits: []string{`"8080:8080"`, `"80800:8080"`}, wantErr: "invalid hostPort: 80800"},
		{name: "bad protocol", edits: []string{`"8080:8080"`, `"8080:8080/tcpx"`}, wantErr: "invalid proto: tcpx"},
		{name: "undeclared volume", edits: []string{"volumes:\n  pgdata:\n", ""}, wantErr: "refers to undefined volume pgdata"},
		{name: "no image nor build", edits: []string{"    image: postgres:15\n", ""}, wantErr: `service "postgres" has neither an image nor a build context`},

		// What checkCompose adds.
		{name: "missing server", edits: []string{"  server:\n", "  srv:\n"}, wantErr: `service "server" is missing`},
		{name: "build context absent", edits: []string{"context: .", "context: ./nowhere"}, wantErr: "nowhere\" is not a directory"},
		{name: "dockerfile absent", edits: []string{"dockerfile: Dockerfile", "dockerfile: Dockerfile.prod"}, wantErr: `no file "Dockerfile.prod"`},
		{name: "waits for health without healthcheck", edits: []string{
			"    healthcheck:\n      test: [\"CMD-SHELL\", \"pg_isready -U ipam\"]\n", ""}, wantErr: "but it has no healthcheck"},
		{name: "healthcheck without command", edits: []string{`test: ["CMD-SHELL", "pg_isready -U ipam"]`, `test: ["CMD"]`},
			wantErr: "healthcheck test"},
		{name: "healthcheck NONE", edits: []string{`test: ["CMD-SHELL", "pg_isready -U ipam"]`, `test: ["NONE"]`},
			wantErr: "healthcheck test"},
		{name: "variable without IPAM_", edits: []string{`IPAM_LISTEN: ":8080"`, `LISTEN: ":8080"`}, wantErr: `"LISTEN" does not start with IPAM_`},
		{name: "misspelt variable", edits: []string{`IPAM_LISTEN: ":8080"`, `IPAM_LISTN: ":8080"`}, wantErr: `"IPAM_LISTN" is not one the server reads`},
		{name: "no database URL", edits: []string{"      IPAM_DATABASE_URL: postgres://ipam:ipam@postgres:5432/ipam?sslmode=disable\n", ""},
			wantErr: "IPAM_DATABASE_URL is unset"},
		{name: "database URL host not a service", edits: []string{"@postgres:5432", "@localhost:5432"}, wantErr: `host "localhost" is not a service`},
	}
	root := fakeRepo(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, err := loadComposeIn(t, root, edit(t, goodCompose, tt.edits...), tt.env)
			if err == nil {
				err = checkCompose(p)
			}
			wantError(t, "loadCompose and checkCompose", err, tt.wantErr)
		})
	}
}

// The repository's own compose file, with one key misspelt or one
// condition unknown, is rejected: the test above is not the only one that
// can fail.
func TestComposeFileMutated(t *testing.T) {
	src := readFile(t, filepath.Join(repoRoot(t), "docker-compose.yaml"))
	for _, tt := range []struct{ old, new, wantErr string }{
		{"condition: service_healthy", "condition: service_ready", "condition value must be one of"},
		{"    restart: unless-stopped", "    restart_policy: unless-stopped", "services.server.restart_policy"},
	} {
		_, err := loadComposeIn(t, fakeRepo(t), edit(t, src, tt.old, tt.new), composeEnv)
		wantError(t, "loadCompose with "+tt.new, err, tt.wantErr)
	}
}

const goodDockerfile = `# syntax=docker/dockerfile:1
ARG GO_VERSION=1.26
FROM --platform=$BUILDPLATFORM golang:${GO_VERSION}-bookworm AS build
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/go/pkg/mod \
    # a comment inside a continuation
    CGO_ENABLED=0 go build -trimpath \
      -o /ipam-server ./cmd/server
RUN <<EOF
echo this heredoc body is not an instruction
EOF

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /ipam-server /ipam-server
EXPOSE 8080
ENTRYPOINT ["/ipam-server"]
CMD ["serve"]
`

func TestParseDockerfile(t *testing.T) {
	instrs, err := parseDockerfile(goodDockerfile)
	if err != nil {
		t.Fatal(err)
	}
	var cmds []string
	for _, in := range instrs {
		cmds = append(cmds, in.Cmd)
	}
	want := []string{"ARG", "FROM", "WORKDIR", "COPY", "RUN", "RUN", "FROM", "COPY", "EXPOSE", "ENTRYPOINT", "CMD"}
	if !slices.Equal(cmds, want) {
		t.Fatalf("instructions %v; want %v", cmds, want)
	}
	build := instrs[4]
	if wantArgs := "--mount=type=cache,target=/go/pkg/mod CGO_ENABLED=0 go build -trimpath -o /ipam-server ./cmd/server"; build.Line != 6 || build.Args != wantArgs {
		t.Errorf("continued RUN = line %d %q; want line 6 %q", build.Line, build.Args, wantArgs)
	}
}

func TestCheckDockerfileFindsProblems(t *testing.T) {
	tests := []struct {
		name    string
		edits   []string
		wantErr string // "" means valid
	}{
		{name: "valid"},
		{name: "USER nonroot on another base", edits: []string{"static-debian12:nonroot\n", "static-debian12:debug\nUSER 65532:65532\n"}},
		{name: "untagged image", edits: []string{"golang:${GO_VERSION}-bookworm", "golang"}, wantErr: `image "golang" has no tag`},
		{name: "empty ARG makes an empty tag", edits: []string{"ARG GO_VERSION=1.26", "ARG GO_VERSION", "-bookworm", ""},
			wantErr: `image "golang:" has no tag`},
		{name: "latest", edits: []string{"static-debian12:nonroot", "static-debian12:latest"}, wantErr: "moving tag latest"},
		{name: "COPY from unknown stage", edits: []string{"--from=build", "--from=builder"}, wantErr: "--from=builder names no earlier stage"},
		{name: "COPY from its own stage", edits: []string{"--from=build", "--from=1"}, wantErr: "--from=1 names no earlier stage"},
		{name: "build path absent", edits: []string{"./cmd/server", "./cmd/serve"}, wantErr: "go build ./cmd/serve: no Go files"},
		{name: "build path not main", edits: []string{"./cmd/server", "./cmd/lib"}, wantErr: "is package lib, not main"},
		{name: "no go build", edits: []string{"go build", "go vet"}, wantErr: "no RUN ... go build"},
		{name: "root user", edits: []string{"EXPOSE 8080", "USER root\nEXPOSE 8080"}, wantErr: `runs as "root"`},
		{name: "uid 0", edits: []string{"EXPOSE 8080", "USER 0:0\nEXPOSE 8080"}, wantErr: `runs as "0:0"`},
		{name: "no USER on a root base", edits: []string{"static-debian12:nonroot", "static-debian12:debug"}, wantErr: "no USER"},
		{name: "shell-form ENTRYPOINT", edits: []string{`ENTRYPOINT ["/ipam-server"]`, `ENTRYPOINT /ipam-server`}, wantErr: "not in JSON exec form"},
		{name: "no ENTRYPOINT", edits: []string{`ENTRYPOINT ["/ipam-server"]` + "\n", ""}, wantErr: "no ENTRYPOINT"},
		{name: "shell-form CMD", edits: []string{`CMD ["serve"]`, `CMD serve`}, wantErr: "CMD serve is not in JSON exec form"},
	}
	root := fakeRepo(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			instrs, err := parseDockerfile(edit(t, goodDockerfile, tt.edits...))
			if err != nil {
				t.Fatalf("parse: %v", err)
			}
			_, err = checkDockerfile(instrs, root)
			wantError(t, "checkDockerfile", err, tt.wantErr)
		})
	}
}

func TestParseDockerfileFindsProblems(t *testing.T) {
	tests := []struct{ name, src, wantErr string }{
		{"unknown instruction", "FROM a:1\nCOPPY . .\n", `unknown instruction "COPPY"`},
		{"unterminated heredoc", "FROM a:1\nRUN <<EOF\necho\n", "unterminated heredoc"},
		{"empty continuation line", "FROM a:1\nRUN echo \\\n\n  done\n", "Empty continuation line"},
	}
	for _, tt := range tests {
		if _, err := parseDockerfile(tt.src); err == nil || !strings.Contains(err.Error(), tt.wantErr) {
			t.Errorf("%s: parseDockerfile = %v; want an error containing %q", tt.name, err, tt.wantErr)
		}
	}
}

func TestCheckServerPortsFindsProblems(t *testing.T) {
	root := fakeRepo(t)
	instrs, err := parseDockerfile(goodDockerfile)
	if err != nil {
		t.Fatal(err)
	}
	sum, err := checkDockerfile(instrs, root)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		edits   []string
		wantErr string
	}{
		{name: "agree"},
		{name: "not exposed", edits: []string{`"8080:8080"`, `"8080:9090"`}, wantErr: "does not EXPOSE"},
		{name: "listens elsewhere", edits: []string{`IPAM_LISTEN: ":8080"`, `IPAM_LISTEN: ":9090"`}, wantErr: "listens on 9090"},
	}
	for _, tt := range tests {
		p, err := loadComposeIn(t, root, edit(t, goodCompose, tt.edits...), nil)
		if err != nil {
			t.Fatal(err)
		}
		err = checkServerPorts(p, sum)
		if (tt.wantErr == "") != (err == nil) || (err != nil && !strings.Contains(err.Error(), tt.wantErr)) {
			t.Errorf("%s: checkServerPorts = %v; want %q", tt.name, err, tt.wantErr)
		}
	}
}

func TestIgnoredBy(t *testing.T) {
	const ignore = "# comment\n.git\n/server\nbin/\n*.test\ndocs\n!docs/keep.md\n"
	tests := []struct{ path, want string }{
		{".git/HEAD", ".git"},
		{"server", "/server"},
		{"cmd/server/main.go", ""},
		{"bin/tool", "bin/"},
		{"pkg.test", "*.test"},
		{"docs/a.md", "docs"},
		{"docs/keep.md", ""},
		{"go.mod", ""},
	}
	for _, tt := range tests {
		if got := ignoredBy(ignore, tt.path); got != tt.want {
			t.Errorf("ignoredBy(%q) = %q; want %q", tt.path, got, tt.want)
		}
	}
}
