// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package deploy

import (
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/ipam-dev/ipam/internal/pki"
)

// ---------------------------------------------------------------------------
// deploy/cni: the DaemonSet that installs ipam-shim, its conflist, and the
// example conflists, checked statically.

const (
	cniDir       = "cni"
	shimType     = "ipam-shim"
	shimImage    = "ghcr.io/ipam-dev/ipam-cni"
	shimBinPath  = "/opt/cni/bin/ipam-shim" // in the image
	hostCNIBin   = "/opt/cni/bin"
	hostCNIConf  = "/etc/cni/net.d"
	shimConfigGo = "cmd/cni-shim/config.go"
)

var cniVersions = []string{"0.3.1", "0.4.0", "1.0.0", "1.1.0"}

// shimFields returns the json tags of ipamSection in cmd/cni-shim/config.go:
// the keys the shim accepts in its ipam section.
func shimFields(src string) ([]string, error) {
	f, err := parser.ParseFile(token.NewFileSet(), shimConfigGo, src, parser.SkipObjectResolution)
	if err != nil {
		return nil, err
	}
	var fields []string
	found := false
	ast.Inspect(f, func(n ast.Node) bool {
		ts, ok := n.(*ast.TypeSpec)
		if !ok || ts.Name.Name != "ipamSection" {
			return true
		}
		st, ok := ts.Type.(*ast.StructType)
		if !ok {
			return false
		}
		found = true
		for _, fl := range st.Fields.List {
			if fl.Tag == nil {
				continue
			}
			tag, err := strconv.Unquote(fl.Tag.Value)
			if err != nil {
				continue
			}
			name, _, _ := strings.Cut(reflect.StructTag(tag).Get("json"), ",")
			if name != "" && name != "-" {
				fields = append(fields, name)
			}
		}
		return false
	})
	if !found || len(fields) == 0 {
		return nil, fmt.Errorf("%s: no struct ipamSection with json tags", shimConfigGo)
	}
	return fields, nil
}

// checkConflist checks a network configuration list that uses ipam-shim:
// fields lists the keys the shim accepts, pkiDir the host directory the
// DaemonSet provides for its credentials.
func checkConflist(name, src string, fields []string, pkiDir string) error {
	var conf struct {
		CNIVersion string `json:"cniVersion"`
		Name       string `json:"name"`
		Plugins    []map[string]json.RawMessage
	}
	if err := json.Unmarshal([]byte(src), &conf); err != nil {
		return fmt.Errorf("%s: not JSON: %w", name, err)
	}
	var errs []error
	if !slices.Contains(cniVersions, conf.CNIVersion) {
		errs = append(errs, fmt.Errorf("%s: cniVersion %q is not one of %v", name, conf.CNIVersion, cniVersions))
	}
	if conf.Name == "" {
		errs = append(errs, fmt.Errorf("%s: no name", name))
	}
	if len(conf.Plugins) == 0 {
		errs = append(errs, fmt.Errorf("%s: no plugins", name))
	}
	shims := 0
	for i, p := range conf.Plugins {
		var typ string
		if err := json.Unmarshal(p["type"], &typ); err != nil || typ == "" {
			errs = append(errs, fmt.Errorf("%s: plugins[%d] has no type", name, i))
		}
		raw, ok := p["ipam"]
		if !ok {
			continue
		}
		var ipam map[string]any
		if err := json.Unmarshal(raw, &ipam); err != nil {
			errs = append(errs, fmt.Errorf("%s: plugins[%d].ipam: %w", name, i, err))
			continue
		}
		if ipam["type"] != shimType {
			errs = append(errs, fmt.Errorf("%s: plugins[%d].ipam.type is %v, not %q", name, i, ipam["type"], shimType))
			continue
		}
		shims++
		errs = append(errs, prefixErr(fmt.Sprintf("%s: plugins[%d].ipam", name, i), checkShimSection(ipam, fields, pkiDir)))
	}
	if shims == 0 {
		errs = append(errs, fmt.Errorf("%s: no plugin has ipam.type %q", name, shimType))
	}
	return errors.Join(errs...)
}

func checkShimSection(ipam map[string]any, fields []string, pkiDir string) error {
	var errs []error
	for _, k := range slices.Sorted(func(yield func(string) bool) {
		for k := range ipam {
			if !yield(k) {
				return
			}
		}
	}) {
		if !slices.Contains(fields, k) {
			errs = append(errs, fmt.Errorf("key %q is not one the shim accepts (%v)", k, fields))
		}
	}
	server, _ := ipam["server"].(string)
	u, err := url.Parse(server)
	switch {
	case err != nil || server == "":
		errs = append(errs, fmt.Errorf("server %q is not a URL", server))
	case u.Scheme != "https" || u.Host == "":
		errs = append(errs, fmt.Errorf("server %q is not https://HOST", server))
	case strings.HasSuffix(u.Hostname(), ".svc") || strings.HasSuffix(u.Hostname(), ".cluster.local"):
		errs = append(errs, fmt.Errorf("server %q: the host's resolver, which the shim uses, does not know cluster DNS names", server))
	}
	// The names `ipam-server issue-cert --node` writes into a node's directory.
	for _, k := range []struct{ key, file string }{{"caFile", pki.CACertFile}, {"certFile", pki.NodeCertFile}, {"keyFile", pki.NodeKeyFile}} {
		p, _ := ipam[k.key].(string)
		switch {
		case p == "":
			errs = append(errs, fmt.Errorf("%s missing", k.key))
		case !path.IsAbs(p) || !strings.HasPrefix(path.Clean(p), pkiDir+"/"):
			errs = append(errs, fmt.Errorf("%s %q is not under %s, the directory the DaemonSet provides", k.key, p, pkiDir))
		case path.Base(p) != k.file:
			errs = append(errs, fmt.Errorf("%s %q: ipam-server issue-cert --node writes %s", k.key, p, k.file))
		}
	}
	return errors.Join(errs...)
}

// checkCNI checks the manifests of deploy/cni (top-level files only) and
// every conflist they install; fields are the shim's ipam keys. It returns
// the installed conflists by file name.
func checkCNI(files map[string]string, fields []string) (map[string]string, error) {
	var errs []error
	kSrc, ok := files[kustomizationFile]
	if !ok {
		return nil, errors.New("no " + kustomizationFile)
	}
	k, err := parseKustomization(kSrc)
	if err != nil {
		return nil, err
	}
	var want []string
	for name := range files {
		if isYAML(name) && name != kustomizationFile {
			want = append(want, name)
		}
	}
	slices.Sort(want)
	if got := slices.Sorted(slices.Values(k.Resources)); !slices.Equal(got, want) {
		errs = append(errs, fmt.Errorf("%s lists %v, but the manifests here are %v", kustomizationFile, got, want))
	}
	var objs []kubeObject
	for _, name := range want {
		o, err := parseManifest(name, files[name])
		errs = append(errs, err)
		objs = append(objs, o...)
	}
	configMaps := map[string]map[string]string{}
	var dss []*appsv1.DaemonSet
	for _, o := range objs {
		switch obj := o.Object.(type) {
		case *corev1.ConfigMap:
			configMaps[o.Metadata.Name] = obj.Data
		case *appsv1.DaemonSet:
			dss = append(dss, obj)
		default:
			errs = append(errs, fmt.Errorf("%s: kind %q is not expected here", o, o.Kind))
		}
		if o.Metadata.Namespace != "" && o.Metadata.Namespace != k.Namespace {
			errs = append(errs, fmt.Errorf("%s: namespace %q differs from the kustomization's %q", o, o.Metadata.Namespace, k.Namespace))
		}
	}
	if len(dss) != 1 {
		return nil, errors.Join(append(errs, fmt.Errorf("%d DaemonSets, want 1", len(dss)))...)
	}
	ds := dss[0].Spec
	pod := ds.Template.Spec
	if !pod.HostNetwork {
		errs = append(errs, errors.New("DaemonSet: no hostNetwork: the Pod must start before the node has a Pod network"))
	}
	if !slices.ContainsFunc(pod.Tolerations, func(t corev1.Toleration) bool {
		return t.Key == "" && t.Operator == corev1.TolerationOpExists && t.Effect == ""
	}) {
		errs = append(errs, errors.New("DaemonSet: does not tolerate every taint (a toleration with only operator: Exists)"))
	}
	if !selects(ds.Selector, ds.Template.Labels) {
		errs = append(errs, errors.New("DaemonSet: the selector does not select the Pod template's labels"))
	}
	volumes := map[string]string{}      // name -> hostPath
	var cmVolumes = map[string]string{} // name -> ConfigMap
	for _, v := range pod.Volumes {
		if v.HostPath != nil {
			volumes[v.Name] = path.Clean(v.HostPath.Path)
		}
		if v.ConfigMap != nil {
			cmVolumes[v.Name] = v.ConfigMap.Name
		}
	}
	for _, c := range slices.Concat(pod.InitContainers, pod.Containers) {
		if err := checkImageTag(c.Image); err != nil {
			errs = append(errs, fmt.Errorf("DaemonSet: container %s: %w", c.Name, err))
		}
	}
	// The install: an initContainer of the plugin image that cp's the
	// binary into a hostPath mount of /opt/cni/bin and the conflists into
	// one of /etc/cni/net.d.
	var install *corev1.Container
	for i, c := range pod.InitContainers {
		if strings.HasPrefix(c.Image, shimImage+":") || strings.HasPrefix(c.Image, shimImage+"@") {
			install = &pod.InitContainers[i]
		}
	}
	if install == nil {
		return nil, errors.Join(append(errs, fmt.Errorf("DaemonSet: no initContainer runs %s", shimImage))...)
	}
	script := strings.Join(slices.Concat(install.Command, install.Args), " ")
	mounted := map[string]string{} // host path -> mount path
	cmMount := map[string]string{} // ConfigMap -> mount path
	for _, m := range install.VolumeMounts {
		if hp, ok := volumes[m.Name]; ok {
			mounted[hp] = path.Clean(m.MountPath)
		}
		if cm, ok := cmVolumes[m.Name]; ok {
			cmMount[cm] = path.Clean(m.MountPath)
		}
	}
	for _, hp := range []string{hostCNIBin, hostCNIConf} {
		if _, ok := mounted[hp]; !ok {
			errs = append(errs, fmt.Errorf("DaemonSet: the install initContainer mounts no hostPath %s", hp))
		}
	}
	if mp, ok := mounted[hostCNIBin]; ok && !strings.Contains(script, "cp "+shimBinPath+" "+mp+"/") {
		errs = append(errs, fmt.Errorf("DaemonSet: the install initContainer does not cp %s into %s", shimBinPath, mp))
	}
	var pkiDir string
	for hp := range mounted {
		if hp != hostCNIBin && hp != hostCNIConf {
			pkiDir = hp
		}
	}
	conflists := map[string]string{}
	for cmName, mp := range cmMount {
		data, ok := configMaps[cmName]
		if !ok {
			errs = append(errs, fmt.Errorf("DaemonSet: mounts ConfigMap %q, which is not here", cmName))
		}
		for key, src := range data {
			if !strings.HasSuffix(key, ".conflist") {
				continue
			}
			conflists[key] = src
			if !strings.Contains(script, "cp "+mp+"/"+key+" ") {
				errs = append(errs, fmt.Errorf("DaemonSet: the install initContainer does not cp %s/%s", mp, key))
			}
			if pkiDir == "" {
				errs = append(errs, errors.New("DaemonSet: the install initContainer mounts no hostPath for the node's credentials"))
			} else {
				errs = append(errs, checkConflist("ConfigMap "+cmName+": "+key, src, fields, pkiDir))
			}
		}
	}
	if len(conflists) == 0 {
		errs = append(errs, errors.New("DaemonSet: installs no conflist from a ConfigMap"))
	}
	return conflists, errors.Join(errs...)
}

// checkCNIDockerfile checks deploy/cni/Dockerfile: go build ./cmd/cni-shim
// with CGO_ENABLED=0, and a final stage (pinned, with a shell for cp) that
// holds the binary at shimBinPath.
func checkCNIDockerfile(instrs []instruction, root string) error {
	var errs []error
	var stages []stage
	built, copied := false, false
	for _, in := range instrs {
		switch in.Cmd {
		case "FROM":
			st, err := parseFrom(strings.Fields(in.Args), nil, stages)
			if err != nil {
				errs = append(errs, fmt.Errorf("line %d: %w", in.Line, err))
			}
			stages = append(stages, st)
			copied = false
		case "RUN":
			if p, ok := goBuildPackage(in.Args); ok {
				if p != "./cmd/cni-shim" {
					errs = append(errs, fmt.Errorf("line %d: builds %s, not ./cmd/cni-shim", in.Line, p))
				} else if !strings.Contains(in.Args, "CGO_ENABLED=0") {
					errs = append(errs, fmt.Errorf("line %d: go build without CGO_ENABLED=0: the binary must run on any node", in.Line))
				} else if err := checkMainPackage(root, p); err != nil {
					errs = append(errs, fmt.Errorf("line %d: %w", in.Line, err))
				} else {
					built = true
				}
			}
		case "COPY":
			words := strings.Fields(in.Args)
			if len(words) > 0 && words[len(words)-1] == shimBinPath {
				copied = true
			}
		}
	}
	if !built {
		errs = append(errs, errors.New("no stage runs CGO_ENABLED=0 go build ./cmd/cni-shim"))
	}
	if len(stages) == 0 {
		return errors.Join(append(errs, errors.New("no FROM"))...)
	}
	if !copied {
		errs = append(errs, fmt.Errorf("the final stage does not COPY the binary to %s", shimBinPath))
	}
	if img := stages[len(stages)-1].image; !strings.HasPrefix(img, "busybox:") {
		errs = append(errs, fmt.Errorf("the final stage's image %q: the initContainer runs /bin/sh and cp, use busybox", img))
	}
	return errors.Join(errs...)
}

func readCNI(t *testing.T) (root string, top, examples map[string]string, fields []string) {
	t.Helper()
	root = repoRoot(t)
	top = readKubeDir(t, filepath.Join(root, "deploy", cniDir))
	examples = readKubeDir(t, filepath.Join(root, "deploy", cniDir, "examples"))
	fields, err := shimFields(readFile(t, filepath.Join(root, filepath.FromSlash(shimConfigGo))))
	if err != nil {
		t.Fatal(err)
	}
	return root, top, examples, fields
}

func TestCNIManifests(t *testing.T) {
	root, top, examples, fields := readCNI(t)
	conflists, err := checkCNI(top, fields)
	if err != nil {
		t.Fatalf("deploy/%s:\n%v", cniDir, err)
	}
	// The installed conflist is the bridge example.
	for name, src := range conflists {
		ex, ok := examples[name]
		if !ok {
			t.Errorf("installed conflist %s has no copy in examples/", name)
			continue
		}
		var a, b any
		if json.Unmarshal([]byte(src), &a) != nil || json.Unmarshal([]byte(ex), &b) != nil || !reflect.DeepEqual(a, b) {
			t.Errorf("the ConfigMap's %s differs from examples/%s", name, name)
		}
	}
	n := 0
	for name, src := range examples {
		if strings.HasSuffix(name, ".conflist") {
			n++
			if err := checkConflist("examples/"+name, src, fields, "/etc/ipam/pki"); err != nil {
				t.Error(err)
			}
		}
	}
	if n != 2 {
		t.Errorf("%d example conflists, want 2", n)
	}
	// Every shipped conflist speaks CNI 1.1.0: below it the runtime sends
	// no GC or STATUS (and below 0.4.0 no CHECK), so they never reach the
	// shim. cilium-cni lists 1.1.0 (plugins/cilium-cni/main.go).
	for name, src := range examples {
		var v struct {
			CNIVersion string `json:"cniVersion"`
		}
		if strings.HasSuffix(name, ".conflist") && (json.Unmarshal([]byte(src), &v) != nil || v.CNIVersion != "1.1.0") {
			t.Errorf("examples/%s: cniVersion %q, want 1.1.0", name, v.CNIVersion)
		}
	}
	// The Cilium agent refuses ipam.mode=delegated-plugin without these
	// (pkg/option/config.go, checkIPAMDelegatedPlugin): the README says so.
	readme := readFile(t, filepath.Join(root, "deploy", cniDir, "README.md"))
	for _, want := range []string{"ipam.mode=delegated-plugin", "endpointHealthChecking.enabled=false",
		"envoyConfig.enabled=false", "local-router-ipv4"} {
		if !strings.Contains(readme, want) {
			t.Errorf("deploy/cni/README.md does not say %s", want)
		}
	}
	instrs, err := parseDockerfile(top["Dockerfile"])
	if err != nil {
		t.Fatal(err)
	}
	if err := checkCNIDockerfile(instrs, root); err != nil {
		t.Errorf("deploy/cni/Dockerfile:\n%v", err)
	}
	if _, err := os.Stat(filepath.Join(root, "cmd", "cni-shim")); err != nil {
		t.Fatal(err)
	}
}

func TestCheckCNIFindsProblems(t *testing.T) {
	_, top, examples, fields := readCNI(t)
	const ds, cm, kus = "daemonset.yaml", "configmap.yaml", kustomizationFile
	bridge := examples["10-bridge-ipam.conflist"]
	tests := []struct {
		name, file, old, new, wantErr string
	}{
		{name: "valid"},
		{"not listed", kus, "  - configmap.yaml\n", "", "kustomization.yaml lists"},
		{"listed absent", kus, "  - daemonset.yaml\n", "  - daemonset.yaml\n  - rbac.yaml\n", "kustomization.yaml lists"},
		{"no hostNetwork", ds, "hostNetwork: true", "hostNetwork: false", "no hostNetwork"},
		{"keyed toleration", ds, "        - operator: Exists\n", "        - operator: Exists\n          key: node.kubernetes.io/not-ready\n", "does not tolerate every taint"},
		{"latest tag", ds, "ipam-cni:0.1.0", "ipam-cni:latest", "moving tag latest"},
		{"untagged pause", ds, "pause:3.10", "pause", "has no tag"},
		{"no cni-bin mount", ds, "              mountPath: /host/opt/cni/bin\n", "              mountPath: /host/opt/cni/bin2\n", "does not cp /opt/cni/bin/ipam-shim"},
		{"bin not hostPath", ds, "            path: /opt/cni/bin\n", "            path: /opt/cni/bin/x\n", "mounts no hostPath /opt/cni/bin"},
		{"conf not hostPath", ds, "            path: /etc/cni/net.d\n", "            path: /etc/cni\n", "mounts no hostPath /etc/cni/net.d"},
		{"install from another image", ds, "image: ghcr.io/ipam-dev/ipam-cni:0.1.0", "image: busybox:1.36", "no initContainer runs"},
		{"conflist not copied", ds, "cp /config/10-bridge-ipam.conflist", "cat /config/10-bridge-ipam.conflist", "does not cp /config/10-bridge-ipam.conflist"},
		{"cm not json", cm, `"name": "ipam-bridge",`, `"name": "ipam-bridge"`, "not JSON"},
		{"cm unknown ipam key", cm, `"pool": "default",`, `"ipPool": "default",`, `key "ipPool" is not one the shim accepts`},
		{"cm plain http", cm, "https://ipam.example.internal:8443", "http://ipam.example.internal:8080", "is not https://HOST"},
		{"cm svc name", cm, "https://ipam.example.internal:8443", "https://ipam-server.ipam.svc:443", "does not know cluster DNS names"},
		{"cm key elsewhere", cm, "/etc/ipam/pki/node.key", "/root/node.key", `keyFile "/root/node.key" is not under /etc/ipam/pki`},
		{"cm key escapes", cm, "/etc/ipam/pki/node.key", "/etc/ipam/pki/../node.key", "is not under /etc/ipam/pki"},
		{"cm cert named per node", cm, "/etc/ipam/pki/node.crt", "/etc/ipam/pki/node-worker-1.crt", "issue-cert --node writes node.crt"},
		{"cm no caFile", cm, `"caFile": "/etc/ipam/pki/ca.crt",`, "", "caFile missing"},
		{"cm version", cm, `"cniVersion": "1.1.0"`, `"cniVersion": "0.2.0"`, `cniVersion "0.2.0" is not one of`},
		{"cm no name", cm, `"name": "ipam-bridge",`, "", "no name"},
		{"cm plugin without type", cm, `"type": "portmap",`, "", "plugins[1] has no type"},
		{"cm other ipam", cm, `"type": "ipam-shim"`, `"type": "host-local"`, `ipam.type is host-local`},
		{"wrong namespace", cm, "namespace: kube-system", "namespace: ipam", "differs from the kustomization's"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			files := maps.Clone(top)
			if tt.file != "" {
				files[tt.file] = edit(t, files[tt.file], tt.old, tt.new)
			}
			_, err := checkCNI(files, fields)
			wantError(t, "checkCNI", err, tt.wantErr)
		})
	}
	t.Run("example with a key the shim lacks", func(t *testing.T) {
		err := checkConflist("x", edit(t, bridge, `"timeout": "10s"`, `"timeout": "10s", "retries": 3`), fields, "/etc/ipam/pki")
		if err == nil || !strings.Contains(err.Error(), `key "retries"`) {
			t.Fatalf("got %v", err)
		}
	})
	t.Run("no plugins", func(t *testing.T) {
		if err := checkConflist("x", `{"cniVersion":"1.0.0","name":"n","plugins":[]}`, fields, "/etc/ipam/pki"); err == nil || !strings.Contains(err.Error(), "no plugins") {
			t.Fatalf("got %v", err)
		}
	})
}

func TestShimFieldsFollowTheCode(t *testing.T) {
	got, err := shimFields("package main\n\ntype ipamSection struct {\n\tA string `json:\"a\"`\n\tB int `json:\"b,omitempty\"`\n\tc int\n}\n")
	if err != nil || !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("got %v, %v", got, err)
	}
	if _, err := shimFields("package main\n\ntype other struct{}\n"); err == nil {
		t.Fatal("no error without ipamSection")
	}
}

func TestCheckCNIDockerfileFindsProblems(t *testing.T) {
	root, top, _, _ := readCNI(t)
	for _, tt := range []struct{ name, old, new, wantErr string }{
		{"valid", "", "", ""},
		{"cgo", "CGO_ENABLED=0 go build", "go build", "without CGO_ENABLED=0"},
		{"other package", "./cmd/cni-shim", "./cmd/server", "not ./cmd/cni-shim"},
		{"distroless final", "FROM busybox:1.36", "FROM gcr.io/distroless/static-debian12:nonroot", "use busybox"},
		{"latest final", "FROM busybox:1.36", "FROM busybox:latest", "moving tag latest"},
		{"binary elsewhere", "/ipam-shim /opt/cni/bin/ipam-shim", "/ipam-shim /ipam-shim", "does not COPY the binary"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			src := top["Dockerfile"]
			if tt.old != "" {
				src = edit(t, src, tt.old, tt.new)
			}
			instrs, err := parseDockerfile(src)
			if err != nil {
				t.Fatal(err)
			}
			err = checkCNIDockerfile(instrs, root)
			if (tt.wantErr == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("got %v, want %q", err, tt.wantErr)
			}
		})
	}
}
