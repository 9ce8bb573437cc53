// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"runtime/debug"
	"strings"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"
)

// pluginType is the name in ipam.type.
const pluginType = "ipam-shim"

// supported are the CNI versions the shim speaks.
var supported = version.PluginSupports("0.3.1", "0.4.0", "1.0.0", "1.1.0")

func main() {
	if conf, ok := os.LookupEnv(backgroundEnv); ok {
		os.Exit(runBackground(conf)) // the reserve's sync (sync.go), not a CNI call
	}
	// skel prints errors without the cniVersion field the specification
	// asks for since 1.0.0, so the shim reads stdin first (to learn the
	// configuration's version), hands skel the same bytes, and prints the
	// error object itself.
	stdin, err := readStdin()
	if err != nil {
		printError(types.NewError(types.ErrIOFailure, "error reading from stdin: "+err.Error(), ""), "")
		os.Exit(1)
	}
	if os.Getenv("CNI_COMMAND") == "" {
		// For a person running the binary; skel still answers code 4.
		fmt.Fprintf(os.Stderr, "%s\nCNI protocol versions supported: %s\n", about(), strings.Join(supported.SupportedVersions(), ", "))
	}
	// An empty about string: skel would otherwise answer a missing
	// CNI_COMMAND with success.
	e := skel.PluginMainFuncsWithError(skel.CNIFuncs{
		Add:    guard(cmdAdd),
		Del:    guard(cmdDel),
		Check:  guard(cmdCheck),
		GC:     guard(cmdGC),
		Status: guard(cmdStatus),
	}, supported, "")
	if e != nil {
		printError(e, configVersion(stdin))
		os.Exit(1)
	}
}

// readStdin reads stdin when a command that takes a configuration is set,
// and points os.Stdin at a pipe that replays it for skel. Without
// CNI_COMMAND (a person running the binary) and for VERSION it reads
// nothing, as skel does.
func readStdin() ([]byte, error) {
	if cmd := os.Getenv("CNI_COMMAND"); cmd == "" || cmd == "VERSION" {
		return nil, nil
	}
	data, err := io.ReadAll(os.Stdin)
	if err != nil {
		return nil, err
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	go func() {
		_, _ = io.Copy(w, bytes.NewReader(data))
		_ = w.Close()
	}()
	os.Stdin = r
	return data, nil
}

// configVersion is the cniVersion of the configuration, or the newest
// supported version when it has none that the shim speaks.
func configVersion(stdin []byte) string {
	var v struct {
		CNIVersion string `json:"cniVersion"`
	}
	if json.Unmarshal(stdin, &v) == nil {
		for _, s := range supported.SupportedVersions() {
			if s == v.CNIVersion {
				return s
			}
		}
	}
	all := supported.SupportedVersions()
	return all[len(all)-1]
}

// printError writes the CNI error object to stdout.
func printError(e *types.Error, cniVersion string) {
	out := struct {
		CNIVersion string `json:"cniVersion,omitempty"`
		*types.Error
	}{cniVersion, e}
	b, err := json.MarshalIndent(out, "", "    ")
	if err != nil {
		b = []byte(`{"code":999,"msg":"cannot encode error"}`)
	}
	_, _ = os.Stdout.Write(append(b, '\n'))
}

func about() string {
	v := "(devel)"
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		v = bi.Main.Version
	}
	return fmt.Sprintf("CNI IPAM plugin %s %s", pluginType, v)
}

// guard turns a panic into CNI error 999, so the runtime always reads JSON.
func guard(f func(*skel.CmdArgs) error) func(*skel.CmdArgs) error {
	return func(args *skel.CmdArgs) (err error) {
		defer func() {
			if r := recover(); r != nil {
				err = types.NewError(types.ErrInternal, fmt.Sprintf("internal error: %v", r), string(debug.Stack()))
			}
		}()
		return f(args)
	}
}

// logKept tells the runtime's log (the plugin's stderr) that a GC kept
// leases the runtime did not list: the service keeps leases younger than its
// --reconcile-min-age (an ADD may race with the runtime's list), so a GC
// soon after a Pod went away releases nothing, silently otherwise.
func logKept(node string, released int, kept int64) {
	if kept == 0 {
		return
	}
	fmt.Fprintf(os.Stderr, "%s: GC on node %s released %d leases and kept %d not in the runtime's list: "+
		"younger than the service's --reconcile-min-age or leased during the GC; a later GC releases them\n",
		pluginType, node, released, kept)
}
