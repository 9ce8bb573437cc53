// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package cilium

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/cilium/cilium/pkg/ipam"
	ipamoption "github.com/cilium/cilium/pkg/ipam/option"
	ciliumclient "github.com/cilium/cilium/pkg/k8s/client/clientset/versioned"
	"github.com/cilium/cilium/pkg/node"
	nodetypes "github.com/cilium/cilium/pkg/node/types"
	"github.com/cilium/cilium/pkg/option"
	"k8s.io/client-go/tools/clientcmd"
)

// crdAgentProcessEnv carries a crdAgentProcess's settings to a copy of
// the test binary that runs one node's Cilium agent IPAM in crd mode and
// nothing else. Cilium's crd allocator keeps its node store in package
// variables (sharedNodeStore behind initNodeStore, pkg/ipam/crd.go) and
// watches the node named by the process-wide nodeTypes.GetName(), so one
// process holds one crd-mode agent: each node is a process of its own, as
// each is a cilium-agent in a cluster.
const crdAgentProcessEnv = "IPAM_TEST_CILIUM_CRD_AGENT"

type crdAgentProcess struct {
	Node       string        `json:"node"`
	Kubeconfig string        `json:"kubeconfig"`
	UpdateRate time.Duration `json:"updateRate"`
}

// The child reads its commands from this descriptor and answers on the
// next (cmd.ExtraFiles), so nothing Cilium's code prints can be taken
// for an answer.
const (
	crdAgentCommandsFD = 3
	crdAgentAnswersFD  = 4
)

// crdOwner and crdEventRegister are what the agent's node discovery and
// Kubernetes watcher give the crd allocator: the CiliumNode exists before
// the agent starts (the parent creates it, as node discovery would), and
// event metrics are not counted.
type crdOwner struct{}

func (crdOwner) UpdateCiliumNodeResource() {}

type crdEventRegister struct{}

func (crdEventRegister) K8sEventReceived(string, string, string, bool, bool) {}
func (crdEventRegister) K8sEventProcessed(string, string, bool)              {}

// runCRDAgentProcess is the body of such a copy: Cilium v1.20.2's own
// ipam.NewIPAM and ConfigureAllocator in crd mode (ipamoption.IPAMCRD),
// which waits until the operator has filled spec.ipam.pool to the
// pre-allocation, then hands out and takes back addresses on the parent's
// commands, one line each:
//
//	allocate <owner>  ->  ok <address> | err <message>
//	release <address> ->  ok | err <message>
//	dump              ->  ok <address>...   (Cilium's own record)
//
// Everything between the allocator and the API server is Cilium's: the
// CiliumNode informer, status.ipam.used written through the rate-limited
// trigger, and the answers to the release handshake
// (status.ipam.release-ips). It exits when the parent closes the commands
// pipe, and with the parent (Pdeathsig): it never returns.
func runCRDAgentProcess(spec string) {
	var p crdAgentProcess
	if err := json.Unmarshal([]byte(spec), &p); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	rc, err := clientcmd.BuildConfigFromFlags("", p.Kubeconfig)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	rc.QPS, rc.Burst = 20, 40
	client, err := ciliumclient.NewForConfig(rc)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	// The name newCRDAllocator subscribes to, as the agent sets it from
	// --k8s-node-name before the IPAM starts.
	nodetypes.SetName(p.Node)
	// Errors only: Cilium's crd allocator warns on every status write
	// that lost a race with the operator's (a conflict it retries), a
	// few hundred lines a run that say nothing.
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError})).With("node", p.Node)
	cfg := &option.DaemonConfig{
		IPAM:                     ipamoption.IPAMCRD,
		EnableIPv4:               true,
		IPAMCiliumNodeUpdateRate: p.UpdateRate,
		IPAMDefaultIPPool:        "default",
		// Off, so the allocator leaves the host's routes alone.
		EnableUnreachableRoutes: false,
	}
	agentIPAM := ipam.NewIPAM(ipam.NewIPAMParams{
		Logger:         log,
		AgentConfig:    cfg,
		NodeDiscovery:  crdOwner{},
		LocalNodeStore: node.NewTestLocalNodeStore(node.LocalNode{Node: nodetypes.Node{Name: p.Node}}),
		K8sEventReg:    crdEventRegister{},
		Clientset:      ciliumOnlyClientset{cilium: client},
	})
	agentIPAM.ConfigureAllocator()
	// As the agent does once it has restored its endpoints' addresses
	// (none here): the first status.ipam.used is written.
	agentIPAM.RestoreFinished()

	commands := bufio.NewScanner(os.NewFile(crdAgentCommandsFD, "commands"))
	answers := bufio.NewWriter(os.NewFile(crdAgentAnswersFD, "answers"))
	answer := func(s string) {
		answers.WriteString(s + "\n")
		if err := answers.Flush(); err != nil {
			os.Exit(1)
		}
	}
	answer("ready")
	for commands.Scan() {
		verb, arg, _ := strings.Cut(commands.Text(), " ")
		switch verb {
		case "allocate":
			res, err := agentIPAM.AllocateNextFamily(ipam.IPv4, arg, "default")
			if err != nil {
				answer("err " + oneLine(err))
				continue
			}
			answer("ok " + res.IP.String())
		case "release":
			addr, err := netip.ParseAddr(arg)
			if err == nil {
				err = agentIPAM.ReleaseIP(addr, "default")
			}
			if err != nil {
				answer("err " + oneLine(err))
				continue
			}
			answer("ok")
		case "dump":
			v4, _, _ := agentIPAM.Dump()
			ips := make([]string, 0, len(v4))
			for ip := range v4 {
				ips = append(ips, ip)
			}
			answer("ok " + strings.Join(ips, " "))
		default:
			answer("err unknown command " + verb)
		}
	}
	os.Exit(0)
}

func oneLine(err error) string { return strings.ReplaceAll(err.Error(), "\n", " ") }

// crdAgent is the parent's end of one crd-mode agent process.
type crdAgent struct {
	name string
	cmd  *exec.Cmd

	// mu makes one command and its answer one exchange.
	mu       sync.Mutex
	commands *os.File
	answers  *os.File
	reader   *bufio.Reader
}

// startCRDAgent starts the agent process of the node name (its CiliumNode
// must exist) on the env's API server. It returns at once; ready waits for
// the agent's allocator.
func (e *crdEnv) startCRDAgent(name string, updateRate time.Duration, kubeconfig string) (*crdAgent, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	spec, _ := json.Marshal(crdAgentProcess{Node: name, Kubeconfig: kubeconfig, UpdateRate: updateRate})
	cmdRead, cmdWrite, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	ansRead, ansWrite, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, "-test.run=^$")
	cmd.Env = append(os.Environ(), crdAgentProcessEnv+"="+string(spec))
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	cmd.ExtraFiles = []*os.File{cmdRead, ansWrite} // fds 3 and 4
	// A test binary that dies takes its agents along.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	err = cmd.Start()
	cmdRead.Close()
	ansWrite.Close()
	if err != nil {
		cmdWrite.Close()
		ansRead.Close()
		return nil, err
	}
	a := &crdAgent{name: name, cmd: cmd, commands: cmdWrite, answers: ansRead, reader: bufio.NewReader(ansRead)}
	e.t.Cleanup(a.kill)
	return a, nil
}

// ready waits up to within for the agent's allocator: Cilium's crd
// allocator polls every 5 s until spec.ipam.pool holds the
// pre-allocation.
func (a *crdAgent) ready(within time.Duration) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	line, err := a.readLine(within)
	if err != nil {
		return fmt.Errorf("agent %s: not ready: %w", a.name, err)
	}
	if line != "ready" {
		return fmt.Errorf("agent %s: %q before ready", a.name, line)
	}
	return nil
}

func (a *crdAgent) readLine(within time.Duration) (string, error) {
	if err := a.answers.SetReadDeadline(time.Now().Add(within)); err != nil {
		return "", err
	}
	line, err := a.reader.ReadString('\n')
	return strings.TrimSuffix(line, "\n"), err
}

// call sends one command and returns its answer's text after "ok "; an
// "err" answer is an error of the agent, a broken pipe or a silence of
// 30 s one of the process.
func (a *crdAgent) call(command string) (string, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, err := a.commands.WriteString(command + "\n"); err != nil {
		return "", fmt.Errorf("agent %s: %w", a.name, err)
	}
	line, err := a.readLine(30 * time.Second)
	if err != nil {
		return "", fmt.Errorf("agent %s: %s: %w", a.name, command, err)
	}
	verb, rest, _ := strings.Cut(line, " ")
	switch verb {
	case "ok":
		return rest, nil
	case "err":
		return "", &crdAgentError{msg: rest}
	}
	return "", fmt.Errorf("agent %s: %s: answer %q", a.name, command, line)
}

// crdAgentError is an error Cilium's agent code returned, as opposed to
// one of the process or its pipes.
type crdAgentError struct{ msg string }

func (e *crdAgentError) Error() string { return e.msg }

func (a *crdAgent) nodeName() string { return a.name }

func (a *crdAgent) allocate(owner string) (netip.Addr, error) {
	s, err := a.call("allocate " + owner)
	if err != nil {
		return netip.Addr{}, err
	}
	return netip.ParseAddr(s)
}

func (a *crdAgent) release(addr netip.Addr) error {
	_, err := a.call("release " + addr.String())
	return err
}

func (a *crdAgent) recorded() ([]string, error) {
	s, err := a.call("dump")
	if err != nil {
		return nil, err
	}
	out := strings.Fields(s)
	slices.Sort(out)
	return out, nil
}

// outOfAddresses tells an allocation that failed because the node has no
// free address from one that failed otherwise.
func (a *crdAgent) outOfAddresses(err error) bool {
	var agentErr *crdAgentError
	return errors.As(err, &agentErr)
}

// kill ends the process: closing its commands ends it, SIGKILL makes sure.
func (a *crdAgent) kill() {
	a.commands.Close()
	_ = a.cmd.Process.Kill()
	_ = a.cmd.Wait()
	a.answers.Close()
}
