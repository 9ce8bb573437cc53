// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"sigs.k8s.io/yaml"

	"github.com/ipam-dev/ipam/internal/kubetest"
)

// whereabouts is the bridge mode's peer with central storage: the IPAM
// plugin Multus users run for cluster-wide addresses, on its Kubernetes
// storage (an IPPool object per range, updated under a Lease per call)
// against the kube-apiserver and etcd of `make tools`. Like the shim, it
// makes network calls on every ADD and DEL; unlike it, it has no
// reserve on the node.
const (
	whereaboutsModule  = "github.com/k8snetworkplumbingwg/whereabouts"
	whereaboutsVersion = "v0.9.2"
	// whereaboutsRange is the range its pairs lease from (none of the
	// benchmark's pools, host-local's or the shim's).
	whereaboutsRange = "10.213.0.0/16"
)

// whereaboutsCRDs are the module's manifests of the CRDs its Kubernetes
// storage writes.
var whereaboutsCRDs = []string{
	"doc/crds/whereabouts.cni.cncf.io_ippools.yaml",
	"doc/crds/whereabouts.cni.cncf.io_overlappingrangeipreservations.yaml",
}

// buildWhereabouts puts the plugin into dir as "whereabouts" (where
// bridge finds it on CNI_PATH) and answers the module's directory. The
// plugin is built once per version, as a release is built, into the
// tools' cache (kubetest.ToolsDir, where make tools builds the API
// server), and linked from there. It is built in a copy of the module
// with the module's own go.mod, so it has the dependencies of its
// release: `go install module@version` refuses a module whose go.mod has
// a replace directive, as whereabouts' has.
func buildWhereabouts(ctx context.Context, dir string) (modDir string, err error) {
	tool, err := goTool()
	if err != nil {
		return "", fmt.Errorf("go tool: %w", err)
	}
	var stdout, stderr bytes.Buffer
	dl := exec.CommandContext(ctx, tool, "mod", "download", "-json", whereaboutsModule+"@"+whereaboutsVersion)
	dl.Env, dl.Dir, dl.Stdout, dl.Stderr = append(os.Environ(), "GOWORK=off"), dir, &stdout, &stderr
	if err := dl.Run(); err != nil {
		return "", fmt.Errorf("go mod download %s@%s: %w: %s", whereaboutsModule, whereaboutsVersion, err, strings.TrimSpace(stderr.String()))
	}
	var mod struct{ Dir string }
	if err := json.Unmarshal(stdout.Bytes(), &mod); err != nil || mod.Dir == "" {
		return "", fmt.Errorf("go mod download %s@%s: no directory in %q (%v)", whereaboutsModule, whereaboutsVersion, stdout.String(), err)
	}
	cached := filepath.Join(kubetest.ToolsDir(), "whereabouts-"+whereaboutsVersion, "whereabouts")
	if _, err := os.Stat(cached); err != nil {
		src, err := os.MkdirTemp("", "ipam-bench-whereabouts-src-")
		if err != nil {
			return "", err
		}
		defer os.RemoveAll(src)
		if err := os.CopyFS(src, os.DirFS(mod.Dir)); err != nil {
			return "", fmt.Errorf("copying %s: %w", mod.Dir, err)
		}
		if err := os.MkdirAll(filepath.Dir(cached), 0o755); err != nil {
			return "", err
		}
		// Built beside its place and renamed there: a build cut short
		// leaves no binary that a later run would take as built.
		building := cached + ".building"
		build := exec.CommandContext(ctx, tool, append(append([]string{"build", "-o", building}, releaseBuild...), "./cmd")...)
		stderr.Reset()
		build.Env, build.Dir, build.Stdout, build.Stderr = append(releaseEnv(), "GOFLAGS=-mod=mod", "GOWORK=off"), src, io.Discard, &stderr
		if err := build.Run(); err != nil {
			return "", fmt.Errorf("go build %s@%s: %w: %s", whereaboutsModule, whereaboutsVersion, err, strings.TrimSpace(stderr.String()))
		}
		if err := os.Rename(building, cached); err != nil {
			return "", err
		}
	}
	if err := os.Symlink(cached, filepath.Join(dir, "whereabouts")); err != nil {
		return "", err
	}
	return mod.Dir, nil
}

// readCRDs reads the CRD manifests files of the module in modDir.
func readCRDs(modDir string, files []string) ([]*apiextensionsv1.CustomResourceDefinition, error) {
	var crds []*apiextensionsv1.CustomResourceDefinition
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(modDir, f))
		if err != nil {
			return nil, err
		}
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := yaml.UnmarshalStrict(b, crd); err != nil {
			return nil, fmt.Errorf("%s: %w", f, err)
		}
		if crd.Kind != "CustomResourceDefinition" || crd.Name == "" {
			return nil, fmt.Errorf("%s: not a CustomResourceDefinition (kind %q, name %q)", f, crd.Kind, crd.Name)
		}
		crds = append(crds, crd)
	}
	return crds, nil
}

// whereaboutsPeer is whereabouts' storage for the bridge mode: a
// kube-apiserver with its CRDs, reachable from the node namespace.
type whereaboutsPeer struct {
	kc         *kubetest.Cluster
	fwd        *forwarder
	kubeconfig string // the apiserver as the node namespace reaches it
	flatFile   string // whereabouts' own configuration file
}

// startWhereabouts starts the API server (kubetest.ErrNoBinaries when
// `make tools` has not built it), installs whereabouts' CRDs from modDir
// and writes, in dir, the kubeconfig and configuration file the plugin
// reads in the node namespace.
func startWhereabouts(ctx context.Context, node *netns, modDir, dir string) (w *whereaboutsPeer, err error) {
	crds, err := readCRDs(modDir, whereaboutsCRDs)
	if err != nil {
		return nil, err
	}
	kc, err := kubetest.Launch()
	if err != nil {
		return nil, err
	}
	w = &whereaboutsPeer{kc: kc}
	defer func() {
		if err != nil {
			w.close()
		}
	}()
	if err := kc.InstallCRDsCtx(ctx, crds...); err != nil {
		return nil, err
	}
	// The API server listens on the host's loopback, which the node
	// namespace does not see: a forwarder listening on the node's
	// loopback takes the plugin's connections there.
	if w.fwd, err = forwardInto(node, strings.TrimPrefix(kc.Host(), "https://")); err != nil {
		return nil, err
	}
	cfg := kc.Config()
	cfg.Host = "https://" + w.fwd.addr()
	w.kubeconfig = filepath.Join(dir, "whereabouts.kubeconfig")
	if err := kc.WriteKubeconfig(cfg, w.kubeconfig); err != nil {
		return nil, err
	}
	flat, err := json.Marshal(map[string]any{"datastore": "kubernetes", "kubernetes": map[string]string{"kubeconfig": w.kubeconfig}})
	if err != nil {
		return nil, err
	}
	w.flatFile = filepath.Join(dir, "whereabouts.conf")
	if err := os.WriteFile(w.flatFile, flat, 0o600); err != nil {
		return nil, err
	}
	return w, nil
}

// ipam is whereabouts' ipam section: the range, its storage, errors only
// in its log (as a cluster runs it).
func (w *whereaboutsPeer) ipam() map[string]any {
	return map[string]any{
		"type":               "whereabouts",
		"range":              whereaboutsRange,
		"configuration_path": w.flatFile,
		"kubernetes":         map[string]string{"kubeconfig": w.kubeconfig},
		"log_level":          "error",
	}
}

func (w *whereaboutsPeer) close() {
	if w.fwd != nil {
		w.fwd.close()
	}
	if err := w.kc.Close(); err != nil {
		fmt.Fprintln(os.Stderr, "ipam-bench: whereabouts: stopping the API server:", err)
	}
}

// forwarder passes every connection made to its listener, on a network
// namespace's loopback, to a target address of the host's namespace.
type forwarder struct {
	ln    net.Listener
	conns sync.WaitGroup
}

// forwardInto listens on ns's loopback (the socket is made on a thread in
// ns, so it stays there) and forwards to target, dialled from the host's
// namespace.
func forwardInto(ns *netns, target string) (*forwarder, error) {
	f := &forwarder{}
	if err := ns.do(func() (err error) {
		f.ln, err = net.Listen("tcp", "127.0.0.1:0")
		return err
	}); err != nil {
		return nil, fmt.Errorf("listening in %s: %w", ns.name, err)
	}
	go f.serve(target)
	return f, nil
}

func (f *forwarder) addr() string { return f.ln.Addr().String() }

func (f *forwarder) serve(target string) {
	for {
		c, err := f.ln.Accept()
		if err != nil {
			return // closed
		}
		f.conns.Go(func() {
			defer c.Close()
			up, err := net.Dial("tcp", target)
			if err != nil {
				return // the plugin sees the connection closed
			}
			defer up.Close()
			done := make(chan struct{})
			go func() {
				_, _ = io.Copy(up, c)
				closeWrite(up)
				close(done)
			}()
			_, _ = io.Copy(c, up)
			closeWrite(c)
			<-done
		})
	}
}

// closeWrite half-closes c, so the far side sees the end of what was sent.
func closeWrite(c net.Conn) {
	if tcp, ok := c.(*net.TCPConn); ok {
		_ = tcp.CloseWrite()
	}
}

func (f *forwarder) close() {
	f.ln.Close()
	f.conns.Wait()
}
