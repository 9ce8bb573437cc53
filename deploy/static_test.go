// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package deploy

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
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
	"IPAM_BATCH_WRITERS",
	"IPAM_BLOCK_TOP_UP",
	"IPAM_BLOCK_TOP_UP_INTERVAL",
	"IPAM_DURABILITY_INTERVAL",
	"IPAM_MAX_IN_FLIGHT",
	"IPAM_ADMISSION_QUEUE",
	"IPAM_ADMISSION_WAIT",
	"IPAM_LBIPAM",
	"IPAM_LBIPAM_CLASSES",
	"IPAM_LBIPAM_DEFAULT_IPAM",
	"IPAM_LBIPAM_FAMILIES",
	"IPAM_LBIPAM_LEASE_NAMESPACE",
	"IPAM_LBIPAM_MIRROR",
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

// compose is the part of a compose file the checks read.
type compose struct {
	Services map[string]service `yaml:"services"`
	Volumes  map[string]any     `yaml:"volumes"`
}

type service struct {
	Image       string        `yaml:"image"`
	Build       *build        `yaml:"build"`
	DependsOn   dependsOn     `yaml:"depends_on"`
	Environment environment   `yaml:"environment"`
	Healthcheck *healthcheck  `yaml:"healthcheck"`
	Ports       []port        `yaml:"ports"`
	Volumes     []volumeMount `yaml:"volumes"`
}

// build is a service's build: a context directory, or a mapping with
// context and dockerfile.
type build struct {
	Context    string `yaml:"context"`
	Dockerfile string `yaml:"dockerfile"`
}

func (b *build) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		b.Context = n.Value
		return nil
	}
	type plain build
	return n.Decode((*plain)(b))
}

// dependsOn maps each dependency to its condition; the list form means
// service_started.
type dependsOn map[string]string

func (d *dependsOn) UnmarshalYAML(n *yaml.Node) error {
	*d = dependsOn{}
	switch n.Kind {
	case yaml.SequenceNode:
		var names []string
		if err := n.Decode(&names); err != nil {
			return err
		}
		for _, name := range names {
			(*d)[name] = "service_started"
		}
	case yaml.MappingNode:
		var m map[string]struct {
			Condition string `yaml:"condition"`
		}
		if err := n.Decode(&m); err != nil {
			return err
		}
		for name, dep := range m {
			(*d)[name] = cmp.Or(dep.Condition, "service_started")
		}
	default:
		return fmt.Errorf("line %d: depends_on is neither a list nor a mapping", n.Line)
	}
	return nil
}

// environment is a service's environment, from the mapping form or the
// list form (KEY=VALUE, or KEY alone to pass the caller's value through).
type environment map[string]string

func (e *environment) UnmarshalYAML(n *yaml.Node) error {
	*e = environment{}
	switch n.Kind {
	case yaml.MappingNode:
		for i := 0; i+1 < len(n.Content); i += 2 {
			(*e)[n.Content[i].Value] = n.Content[i+1].Value
		}
	case yaml.SequenceNode:
		for _, item := range n.Content {
			k, v, _ := strings.Cut(item.Value, "=")
			(*e)[k] = v
		}
	default:
		return fmt.Errorf("line %d: environment is neither a mapping nor a list", n.Line)
	}
	return nil
}

type healthcheck struct {
	Test    yaml.Node `yaml:"test"`
	Disable bool      `yaml:"disable"`
}

// command returns the healthcheck's test as words; a string is one
// CMD-SHELL command.
func (h *healthcheck) command() []string {
	switch h.Test.Kind {
	case yaml.ScalarNode:
		if h.Test.Value == "" {
			return nil
		}
		return []string{"CMD-SHELL", h.Test.Value}
	case yaml.SequenceNode:
		var words []string
		_ = h.Test.Decode(&words)
		return words
	}
	return nil
}

// port is one entry of a service's ports, kept in the short syntax
// [HOST_IP:][HOST:]CONTAINER[/PROTOCOL]; the long syntax is converted to it.
type port struct{ spec string }

func (p *port) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		p.spec = n.Value
		return nil
	}
	var long struct {
		Target    string `yaml:"target"`
		Published string `yaml:"published"`
		HostIP    string `yaml:"host_ip"`
		Protocol  string `yaml:"protocol"`
	}
	if err := n.Decode(&long); err != nil {
		return err
	}
	spec := long.Target
	if long.Published != "" || long.HostIP != "" {
		spec = long.Published + ":" + spec
	}
	if long.HostIP != "" {
		host := long.HostIP
		if strings.Contains(host, ":") {
			host = "[" + host + "]"
		}
		spec = host + ":" + spec
	}
	if long.Protocol != "" {
		spec += "/" + long.Protocol
	}
	p.spec = spec
	return nil
}

// volumeMount is one entry of a service's volumes; only its source matters.
type volumeMount struct{ source string }

func (v *volumeMount) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		v.source, _, _ = strings.Cut(n.Value, ":")
		return nil
	}
	var long struct {
		Source string `yaml:"source"`
	}
	err := n.Decode(&long)
	v.source = long.Source
	return err
}

// named reports whether the mount's source is a named volume rather than a
// path on the host.
func (v volumeMount) named() bool {
	return v.source != "" && !strings.ContainsAny(v.source[:1], "./~$")
}

func parseCompose(src string) (compose, error) {
	var c compose
	err := yaml.Unmarshal([]byte(src), &c)
	return c, err
}

// checkCompose reports every problem with c. root is the compose file's
// directory, which build contexts are relative to.
func checkCompose(c compose, root string) error {
	var errs []error
	for _, name := range []string{databaseService, serverService} {
		if _, ok := c.Services[name]; !ok {
			errs = append(errs, fmt.Errorf("service %q is missing", name))
		}
	}
	names := make([]string, 0, len(c.Services))
	for name := range c.Services {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		s := c.Services[name]
		if s.Image == "" && s.Build == nil {
			errs = append(errs, fmt.Errorf("service %q has neither image nor build", name))
		}
		if s.Build != nil {
			if err := checkBuild(*s.Build, root); err != nil {
				errs = append(errs, fmt.Errorf("service %q: %w", name, err))
			}
		}
		errs = append(errs, checkDependsOn(c, name))
		if s.Healthcheck != nil {
			if cmd := s.Healthcheck.command(); s.Healthcheck.Disable || len(cmd) < 2 ||
				!slices.Contains([]string{"CMD", "CMD-SHELL"}, cmd[0]) {
				errs = append(errs, fmt.Errorf("service %q: healthcheck test %v is not [CMD|CMD-SHELL, command...]", name, cmd))
			}
		}
		for _, p := range s.Ports {
			if err := checkPort(p.spec); err != nil {
				errs = append(errs, fmt.Errorf("service %q: port %q: %w", name, p.spec, err))
			}
		}
		for _, v := range s.Volumes {
			if _, declared := c.Volumes[v.source]; v.named() && !declared {
				errs = append(errs, fmt.Errorf("service %q: volume %q is not declared under the top-level volumes", name, v.source))
			}
		}
	}
	if db, ok := c.Services[databaseService]; ok && db.Healthcheck == nil {
		errs = append(errs, fmt.Errorf("service %q has no healthcheck", databaseService))
	}
	if srv, ok := c.Services[serverService]; ok {
		if srv.Build == nil {
			errs = append(errs, fmt.Errorf("service %q is not built from this repository", serverService))
		}
		errs = append(errs, checkServerEnv(c))
	}
	return errors.Join(errs...)
}

// checkBuild checks that the build context is a directory holding the named
// Dockerfile.
func checkBuild(b build, root string) error {
	dir := filepath.Join(root, cmp.Or(b.Context, "."))
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return fmt.Errorf("build context %q is not a directory", b.Context)
	}
	dockerfile := cmp.Or(b.Dockerfile, "Dockerfile")
	if fi, err := os.Stat(filepath.Join(dir, dockerfile)); err != nil || !fi.Mode().IsRegular() {
		return fmt.Errorf("build context %q has no file %q", b.Context, dockerfile)
	}
	return nil
}

// checkDependsOn checks the dependencies of service name: defined, not
// itself, a known condition, and a healthcheck to wait for.
func checkDependsOn(c compose, name string) error {
	var errs []error
	deps := c.Services[name].DependsOn
	for _, dep := range slices.Sorted(maps.Keys(deps)) {
		cond := deps[dep]
		target, ok := c.Services[dep]
		switch {
		case !ok:
			errs = append(errs, fmt.Errorf("service %q depends on undefined service %q", name, dep))
		case dep == name:
			errs = append(errs, fmt.Errorf("service %q depends on itself", name))
		case !slices.Contains([]string{"service_started", "service_healthy", "service_completed_successfully"}, cond):
			errs = append(errs, fmt.Errorf("service %q: depends_on %q has unknown condition %q", name, dep, cond))
		case cond == "service_healthy" && target.Healthcheck == nil:
			errs = append(errs, fmt.Errorf("service %q waits for %q to be healthy, but it has no healthcheck", name, dep))
		}
	}
	return errors.Join(errs...)
}

// checkServerEnv checks the server's environment: only variables the server
// reads, and a database URL that names a service the server waits for.
func checkServerEnv(c compose) error {
	var errs []error
	srv := c.Services[serverService]
	for _, k := range slices.Sorted(maps.Keys(srv.Environment)) {
		switch {
		case !strings.HasPrefix(k, "IPAM_"):
			errs = append(errs, fmt.Errorf("service %q: environment variable %q does not start with IPAM_", serverService, k))
		case !slices.Contains(serverEnv, k):
			errs = append(errs, fmt.Errorf("service %q: environment variable %q is not one the server reads (%v)", serverService, k, serverEnv))
		}
	}
	dbURL := srv.Environment["IPAM_DATABASE_URL"]
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
		if _, ok := c.Services[u.Hostname()]; !ok {
			errs = append(errs, fmt.Errorf("service %q: IPAM_DATABASE_URL host %q is not a service", serverService, u.Hostname()))
		} else if _, waits := srv.DependsOn[u.Hostname()]; !waits {
			errs = append(errs, fmt.Errorf("service %q does not depend on its database %q", serverService, u.Hostname()))
		}
	}
	return errors.Join(errs...)
}

// checkPort checks a short-syntax port [HOST_IP:][HOST:]CONTAINER[/PROTOCOL],
// where HOST and CONTAINER are ports or ranges (8000-8010) and an IPv6
// HOST_IP is in brackets.
func checkPort(spec string) error {
	if spec == "" {
		return errors.New("empty")
	}
	if rest, proto, ok := strings.Cut(spec, "/"); ok {
		if !slices.Contains([]string{"tcp", "udp", "sctp"}, proto) {
			return fmt.Errorf("protocol %q is not tcp, udp or sctp", proto)
		}
		spec = rest
	}
	if strings.HasPrefix(spec, "[") {
		ip, rest, ok := strings.Cut(spec[1:], "]:")
		if !ok {
			return errors.New("unterminated [IPv6 address]")
		}
		if a, err := netip.ParseAddr(ip); err != nil || !a.Is6() {
			return fmt.Errorf("host IP %q is not an IPv6 address", ip)
		}
		spec = rest
		if strings.Count(spec, ":") != 1 {
			return errors.New("want [HOST_IP]:HOST:CONTAINER")
		}
	}
	parts := strings.Split(spec, ":")
	if len(parts) > 3 {
		return errors.New("too many colons (an IPv6 host IP needs brackets)")
	}
	if len(parts) == 3 {
		if _, err := netip.ParseAddr(parts[0]); err != nil {
			return fmt.Errorf("host IP %q: %w", parts[0], err)
		}
		parts = parts[1:]
	}
	container, err := portRange(parts[len(parts)-1])
	if err != nil {
		return fmt.Errorf("container port: %w", err)
	}
	if len(parts) == 2 && parts[0] != "" { // an empty HOST means any free port
		host, err := portRange(parts[0])
		if err != nil {
			return fmt.Errorf("host port: %w", err)
		}
		if container > 1 && host != container {
			return fmt.Errorf("host range of %d ports for a container range of %d", host, container)
		}
	}
	return nil
}

// portRange parses "N" or "N-M" and returns how many ports it holds.
func portRange(s string) (int, error) {
	lo, hi, isRange := strings.Cut(s, "-")
	if !isRange {
		hi = lo
	}
	a, errA := strconv.Atoi(lo)
	b, errB := strconv.Atoi(hi)
	if errA != nil || errB != nil || a < 1 || b > 65535 || a > b {
		return 0, fmt.Errorf("%q is not a port or range within 1-65535", s)
	}
	return b - a + 1, nil
}

// ---------------------------------------------------------------------------
// Dockerfile

// instruction is one Dockerfile instruction with its continuation lines
// joined.
type instruction struct {
	Line int    // where it starts, from 1
	Cmd  string // upper case: FROM, RUN, ...
	Args string
}

var knownInstructions = []string{
	"ADD", "ARG", "CMD", "COPY", "ENTRYPOINT", "ENV", "EXPOSE", "FROM", "HEALTHCHECK",
	"LABEL", "MAINTAINER", "ONBUILD", "RUN", "SHELL", "STOPSIGNAL", "USER", "VOLUME", "WORKDIR",
}

var heredocStart = regexp.MustCompile(`<<-?["']?([A-Za-z_][A-Za-z0-9_]*)["']?`)

// parseDockerfile splits src into instructions. A line ending in a backslash
// continues on the next; comment lines, also within a continuation, are
// dropped, as are the bodies of heredocs (RUN <<EOF ... EOF).
func parseDockerfile(src string) ([]instruction, error) {
	var out []instruction
	var cur *instruction
	var args []string
	lines := strings.Split(src, "\n")
	for i := 0; i < len(lines); i++ {
		line := strings.TrimRight(lines[i], " \t\r")
		trimmed := strings.TrimSpace(line)
		if trimmed == "" || strings.HasPrefix(trimmed, "#") {
			continue
		}
		if cur == nil {
			keyword, rest, _ := strings.Cut(trimmed, " ")
			if k, r, ok := strings.Cut(trimmed, "\t"); ok && len(k) < len(keyword) {
				keyword, rest = k, r
			}
			cur = &instruction{Line: i + 1, Cmd: strings.ToUpper(keyword)}
			if !slices.Contains(knownInstructions, cur.Cmd) {
				return nil, fmt.Errorf("line %d: unknown instruction %q", i+1, keyword)
			}
			line = rest
		}
		if cont, ok := strings.CutSuffix(line, `\`); ok {
			args = append(args, strings.TrimSpace(cont))
			continue
		}
		args = append(args, strings.TrimSpace(line))
		cur.Args = strings.TrimSpace(strings.Join(args, " "))
		if m := heredocStart.FindStringSubmatch(cur.Args); m != nil && (cur.Cmd == "RUN" || cur.Cmd == "COPY") {
			for i++; i < len(lines) && strings.TrimSpace(lines[i]) != m[1]; i++ {
			}
			if i == len(lines) {
				return nil, fmt.Errorf("line %d: heredoc %s is not terminated", cur.Line, m[1])
			}
		}
		out = append(out, *cur)
		cur, args = nil, nil
	}
	if cur != nil {
		return nil, fmt.Errorf("line %d: continuation runs past the end of the file", cur.Line)
	}
	return out, nil
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
func checkServerPorts(c compose, d dockerfileSummary) error {
	var errs []error
	srv := c.Services[serverService]
	_, listenPort, err := splitHostPort(cmp.Or(srv.Environment["IPAM_LISTEN"], ":8080"))
	if err != nil {
		errs = append(errs, fmt.Errorf("IPAM_LISTEN: %w", err))
	}
	exposed := d.final().expose
	for _, p := range srv.Ports {
		spec, _, _ := strings.Cut(p.spec, "/")
		container := spec[strings.LastIndex(spec, ":")+1:]
		if !slices.Contains(exposed, container) && !slices.Contains(exposed, container+"/tcp") {
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
	root := repoRoot(t)
	c, err := parseCompose(readFile(t, filepath.Join(root, "docker-compose.yaml")))
	if err != nil {
		t.Fatalf("docker-compose.yaml: %v", err)
	}
	if err := checkCompose(c, root); err != nil {
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
	c, err := parseCompose(readFile(t, filepath.Join(root, "docker-compose.yaml")))
	if err != nil {
		t.Fatal(err)
	}
	if err := checkServerPorts(c, sum); err != nil {
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

func TestCheckComposeFindsProblems(t *testing.T) {
	tests := []struct {
		name    string
		edits   []string // old, new, ...
		wantErr string   // "" means valid
	}{
		{name: "valid", wantErr: ""},
		{name: "list forms of depends_on and environment",
			edits: []string{
				"depends_on:\n      postgres:\n        condition: service_healthy", "depends_on: [postgres]",
				"environment:\n      IPAM_DATABASE_URL: ", "environment:\n      - IPAM_DATABASE_URL=",
				`      IPAM_LISTEN: ":8080"`, `      - IPAM_LISTEN=:8080`,
			}},
		{name: "missing server", edits: []string{"  server:\n", "  srv:\n"}, wantErr: `service "server" is missing`},
		{name: "build context absent", edits: []string{"context: .", "context: ./nowhere"}, wantErr: `build context "./nowhere" is not a directory`},
		{name: "dockerfile absent", edits: []string{"dockerfile: Dockerfile", "dockerfile: Dockerfile.prod"}, wantErr: `no file "Dockerfile.prod"`},
		{name: "depends on undefined", edits: []string{"      postgres:\n        condition", "      db:\n        condition"},
			wantErr: `depends on undefined service "db"`},
		{name: "unknown condition", edits: []string{"condition: service_healthy", "condition: healthy"}, wantErr: `unknown condition "healthy"`},
		{name: "waits for health without healthcheck", edits: []string{
			"    healthcheck:\n      test: [\"CMD-SHELL\", \"pg_isready -U ipam\"]\n", ""}, wantErr: "but it has no healthcheck"},
		{name: "healthcheck without command", edits: []string{`test: ["CMD-SHELL", "pg_isready -U ipam"]`, `test: ["CMD"]`},
			wantErr: "healthcheck test"},
		{name: "variable without IPAM_", edits: []string{`IPAM_LISTEN: ":8080"`, `LISTEN: ":8080"`}, wantErr: `"LISTEN" does not start with IPAM_`},
		{name: "misspelt variable", edits: []string{`IPAM_LISTEN: ":8080"`, `IPAM_LISTN: ":8080"`}, wantErr: `"IPAM_LISTN" is not one the server reads`},
		{name: "no database URL", edits: []string{"      IPAM_DATABASE_URL: postgres://ipam:ipam@postgres:5432/ipam?sslmode=disable\n", ""},
			wantErr: "IPAM_DATABASE_URL is unset"},
		{name: "database URL host not a service", edits: []string{"@postgres:5432", "@localhost:5432"}, wantErr: `host "localhost" is not a service`},
		{name: "host port out of range", edits: []string{`"8080:8080"`, `"80800:8080"`}, wantErr: `port "80800:8080"`},
		{name: "bad protocol", edits: []string{`"8080:8080"`, `"8080:8080/tcpx"`}, wantErr: `protocol "tcpx"`},
		{name: "undeclared volume", edits: []string{"volumes:\n  pgdata:\n", ""}, wantErr: `volume "pgdata" is not declared`},
		{name: "no image nor build", edits: []string{"    image: postgres:15\n", ""}, wantErr: `service "postgres" has neither image nor build`},
	}
	root := fakeRepo(t)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := parseCompose(edit(t, goodCompose, tt.edits...))
			if err != nil {
				t.Fatalf("parse: %v", err)
			}
			err = checkCompose(c, root)
			wantError(t, "checkCompose", err, tt.wantErr)
		})
	}
}

func TestCheckPort(t *testing.T) {
	good := []string{"8080", "8080:8080", "127.0.0.1:8080:8080", "127.0.0.1::8080", "[::1]:8080:8080",
		"8000-8001:8000-8001", "9000-9001:80", "8080:8080/udp"}
	bad := []string{"", "0:8080", "65536:80", "a:b", "8080:8080/icmp", "1.2.3:80:80", "::1:80:80",
		"8001-8000:80", "8000-8002:8000-8001", "1:2:3:4", "[127.0.0.1]:80:80", "[::1:80:80"}
	for _, p := range good {
		if err := checkPort(p); err != nil {
			t.Errorf("checkPort(%q) = %v; want nil", p, err)
		}
	}
	for _, p := range bad {
		if err := checkPort(p); err == nil {
			t.Errorf("checkPort(%q) = nil; want an error", p)
		}
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
		{"dangling continuation", "FROM a:1\nRUN echo \\\n", "continuation runs past the end"},
		{"unknown instruction", "FROM a:1\nCOPPY . .\n", `unknown instruction "COPPY"`},
		{"unterminated heredoc", "FROM a:1\nRUN <<EOF\necho\n", "heredoc EOF is not terminated"},
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
		c, err := parseCompose(edit(t, goodCompose, tt.edits...))
		if err != nil {
			t.Fatal(err)
		}
		err = checkServerPorts(c, sum)
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
