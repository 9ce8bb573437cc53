// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"syscall"
	"time"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/ipam-dev/ipam/api/ipamclient"
)

// The node's reserve: a few addresses leased to the node in advance, so a
// Pod starts while the service is unreachable, as Cilium's agent allocates
// from its node's CIDR without the operator.
//
// Each slot is an ordinary active lease of the service: the attachment
// (network, "ipam-shim-reserve-N", "reserve"), owned by cni-reserve/NETWORK,
// so nobody else can lease its addresses. The node-local file (dataDir/
// reserve.json, under an flock of dataDir/lock) records each slot's
// addresses and generation, which Pod took it while the service was
// unreachable, and the DELs made meanwhile. The next call that reaches the
// service replays the DELs, then hands each taken slot over to its Pod
// (LeaseRequest.fromReserve: same addresses, the Pod's attachment and
// owner), then refills the reserve.
const (
	defaultReserve = 4
	maxReserve     = 64
	defaultDataDir = "/var/lib/cni/ipam-shim"
	// reserveInterface is the interface of the slots' attachments.
	reserveInterface = "reserve"
	// reserveOwnerNamespace owns the slots' leases; the name is the network.
	// The server knows it (alloc.ReserveOwnerNamespace) and looks no Pod up
	// for it.
	reserveOwnerNamespace = "cni-reserve"
	// lockWait bounds the wait for another shim's lock.
	lockWait = 5 * time.Second
)

// reserveState is the content of the reserve file.
type reserveState struct {
	Slots []reserveSlot `json:"slots"`
	// Dels are attachments released while the service was unreachable, in
	// order; they are released at the service before any handover.
	Dels []pendingDel `json:"dels,omitempty"`
}

// reserveSlot is one address set leased to the node in advance.
type reserveSlot struct {
	ID         int                       `json:"id"`
	Generation int64                     `json:"generation"`
	Addresses  []ipamclient.LeaseAddress `json:"addresses"`
	// UsedBy is the Pod the slot was given to while the service was
	// unreachable; nil while the slot is free.
	UsedBy *reserveUse `json:"usedBy,omitempty"`
	// Returned is a slot whose Pod stopped before its handover: its
	// addresses are not given to another Pod from the node (the
	// service's cooldown has not run for them), but released at the
	// service by the next sync, and a new slot takes its place.
	Returned bool `json:"returned,omitempty"`
}

// isFree reports whether the slot can serve a Pod.
func (sl *reserveSlot) isFree() bool { return sl.UsedBy == nil && !sl.Returned }

// reserveUse is the attachment a slot serves until it is handed over.
type reserveUse struct {
	ContainerID string           `json:"containerID"`
	IfName      string           `json:"ifname"`
	Owner       ipamclient.Owner `json:"owner"`
}

// pendingDel is a DEL the service has not seen yet.
type pendingDel struct {
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifname"`
}

func slotContainerID(id int) string { return "ipam-shim-reserve-" + strconv.Itoa(id) }

// pending reports work for the service: DELs to replay, slots to hand
// over or to release.
func (s *reserveState) pending() bool {
	if len(s.Dels) > 0 {
		return true
	}
	return slices.ContainsFunc(s.Slots, func(sl reserveSlot) bool { return sl.UsedBy != nil || sl.Returned })
}

// free counts the slots that can serve a Pod.
func (s *reserveState) free() int {
	n := 0
	for i := range s.Slots {
		if s.Slots[i].isFree() {
			n++
		}
	}
	return n
}

// servedSlot is the slot serving containerID/ifname, or nil.
func (s *reserveState) servedSlot(containerID, ifname string) *reserveSlot {
	for i := range s.Slots {
		if u := s.Slots[i].UsedBy; u != nil && u.ContainerID == containerID && u.IfName == ifname {
			return &s.Slots[i]
		}
	}
	return nil
}

// take gives the free slot with the lowest id to use; nil when none is free.
func (s *reserveState) take(use reserveUse) *reserveSlot {
	var best *reserveSlot
	for i := range s.Slots {
		if s.Slots[i].isFree() && (best == nil || s.Slots[i].ID < best.ID) {
			best = &s.Slots[i]
		}
	}
	if best != nil {
		best.UsedBy = &use
	}
	return best
}

// nextID is the lowest slot id not in use.
func (s *reserveState) nextID() int {
	for id := 0; ; id++ {
		if !slices.ContainsFunc(s.Slots, func(sl reserveSlot) bool { return sl.ID == id }) {
			return id
		}
	}
}

// reserveFile is the locked reserve file of one network on the node.
type reserveFile struct {
	dir  string
	lock *os.File // held (flock LOCK_EX) while open
	st   reserveState
}

func reservePath(dir string) string { return filepath.Join(dir, "reserve.json") }

// readReserve reads the state without the lock: a hint (the file is
// replaced whole by rename, so it is never torn), or the state under the
// lock. A missing file is an empty reserve.
func readReserve(dir string) (reserveState, error) {
	var st reserveState
	b, err := os.ReadFile(reservePath(dir))
	if errors.Is(err, os.ErrNotExist) {
		return st, nil
	}
	if err != nil {
		return st, err
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, fmt.Errorf("%s: %w", reservePath(dir), err)
	}
	return st, nil
}

// lockReserve takes the exclusive lock of dir (created if missing), waiting
// at most wait, and reads the state. With wait 0 it does not wait: a held
// lock answers errLocked.
func lockReserve(dir string, wait time.Duration) (*reserveFile, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	deadline := time.Now().Add(wait)
	for {
		err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, syscall.EWOULDBLOCK) && !errors.Is(err, syscall.EINTR) {
			_ = f.Close()
			return nil, err
		}
		if !time.Now().Before(deadline) {
			_ = f.Close()
			return nil, errLocked
		}
		// Another shim holds it for a few file operations, or for a
		// sync with the service: poll, as flock cannot wait with a
		// deadline.
		time.Sleep(5 * time.Millisecond)
	}
	r := &reserveFile{dir: dir, lock: f}
	if r.st, err = readReserve(dir); err != nil {
		r.close()
		return nil, err
	}
	return r, nil
}

var errLocked = errors.New("the reserve is locked by another call")

// save writes the state: a new file renamed over the old one, synced, so a
// crash leaves the old state or the new one.
func (r *reserveFile) save() error {
	b, err := json.MarshalIndent(r.st, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(r.dir, "reserve-*.tmp")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name()) //nolint:errcheck // gone after the rename
	if _, err := tmp.Write(b); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		_ = tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), reservePath(r.dir)); err != nil {
		return err
	}
	d, err := os.Open(r.dir)
	if err != nil {
		return err
	}
	defer d.Close() //nolint:errcheck // read-only
	return d.Sync()
}

func (r *reserveFile) close() {
	_ = r.lock.Close() // releases the flock
}

// reserveError is the error of a reserve operation: the node-local file is
// out of order, which an operator must fix.
func reserveError(op string, err error) *types.Error {
	return types.NewError(types.ErrIOFailure, op+": the node's address reserve: "+err.Error(), "")
}

// reserveFallback reports whether err (of a call to the service) lets the
// reserve serve instead: the service is unreachable or unavailable.
func reserveFallback(err error) bool { return isCode(err, types.ErrTryAgainLater) }

// isCode reports whether err is a CNI error of code.
func isCode(err error, code uint) bool {
	var e *types.Error
	return errors.As(err, &e) && e.Code == code
}

// addFromReserve serves ADD from the reserve: the slot that already serves
// the attachment (a retry), else a free one, recorded as the Pod's. With no
// free slot it answers cause.
func (c *call) addFromReserve(containerID, ifname string, owner ipamclient.Owner, cause error) (*ipamclient.Allocation, error) {
	r, err := lockReserve(c.cfg.dataDir, lockWait)
	if err != nil {
		return nil, reserveError("add", err)
	}
	defer r.close()
	sl := r.st.servedSlot(containerID, ifname)
	if sl == nil {
		if sl = r.st.take(reserveUse{ContainerID: containerID, IfName: ifname, Owner: owner}); sl == nil {
			var e *types.Error
			if errors.As(cause, &e) {
				e2 := *e
				e2.Msg += "; the node's address reserve is empty"
				return nil, &e2
			}
			return nil, cause
		}
		if err := r.save(); err != nil {
			return nil, reserveError("add", err)
		}
	}
	return &ipamclient.Allocation{Addresses: sl.Addresses, Generation: sl.Generation}, nil
}

// delOffline records a DEL the service could not take: a slot serving the
// attachment is returned (released at the service by the next sync, so
// its addresses cool down there before another Pod gets them), and the
// DEL is replayed later (the service may hold the attachment too: an ADD
// whose answer was lost).
func (c *call) delOffline(containerID, ifname string) error {
	r, err := lockReserve(c.cfg.dataDir, lockWait)
	if err != nil {
		return reserveError("del", err)
	}
	defer r.close()
	if sl := r.st.servedSlot(containerID, ifname); sl != nil {
		sl.UsedBy, sl.Returned = nil, true
	}
	d := pendingDel{ContainerID: containerID, IfName: ifname}
	if !slices.Contains(r.st.Dels, d) {
		r.st.Dels = append(r.st.Dels, d)
	}
	if err := r.save(); err != nil {
		return reserveError("del", err)
	}
	return nil
}

// served answers the reserve addresses serving containerID/ifname that the
// service has not taken over yet; nil when none (or no reserve).
func (c *call) served(containerID, ifname string) *ipamclient.Allocation {
	st, err := readReserve(c.cfg.dataDir)
	if err != nil {
		return nil
	}
	if sl := st.servedSlot(containerID, ifname); sl != nil {
		return &ipamclient.Allocation{Addresses: sl.Addresses, Generation: sl.Generation}
	}
	return nil
}

// syncReserve brings the service up to date with the reserve file when it
// has work (DELs to replay, slots to hand over), under the lock: the DELs
// first, then the handovers. It answers the first error that says the
// service is unreachable (the rest waits for the next call); a request the
// service refuses for good is dropped from the file and reported on
// stderr, as retrying it could never succeed.
func (c *call) syncReserve() error {
	if st, err := readReserve(c.cfg.dataDir); err != nil || !st.pending() {
		return nil // nothing to do; a broken file is reported by the calls that use it
	}
	r, err := lockReserve(c.cfg.dataDir, lockWait)
	if err != nil {
		return nil // another call holds it, and syncs
	}
	defer r.close()
	return c.syncLocked(r)
}

// syncLocked is syncReserve holding r.
func (c *call) syncLocked(r *reserveFile) error {
	var failed error
	for len(r.st.Dels) > 0 && failed == nil {
		d := r.st.Dels[0]
		resp, err := c.client.ReleaseAttachmentWithResponse(c.ctx, c.cfg.node, d.ContainerID, d.IfName,
			&ipamclient.ReleaseAttachmentParams{Space: c.space(), Network: c.network()})
		switch {
		case err != nil:
			failed = transportError("reserve: replay del", err)
			continue
		case resp.StatusCode() == http.StatusNoContent || isNotFound(resp.StatusCode(), resp.Body):
		default:
			e := problemError("reserve: replay del", resp.StatusCode(), resp.Body)
			if e.Code == types.ErrTryAgainLater {
				failed = e
				continue
			}
			fmt.Fprintf(os.Stderr, "ipam-shim: dropping the DEL of %s/%s: %v\n", d.ContainerID, d.IfName, e)
		}
		r.st.Dels = r.st.Dels[1:]
	}
	for i := 0; i < len(r.st.Slots) && failed == nil; i++ {
		sl := &r.st.Slots[i]
		if !sl.Returned {
			continue
		}
		if err := c.releaseSlot(*sl); err != nil {
			if e, ok := err.(*types.Error); !ok || e.Code == types.ErrTryAgainLater {
				failed = err
				continue
			}
			fmt.Fprintf(os.Stderr, "ipam-shim: dropping returned reserve slot %d (%v): %v\n", sl.ID, addressesOf(sl.Addresses), err)
		}
		r.st.Slots = slices.Delete(r.st.Slots, i, i+1)
		i--
	}
	for i := 0; i < len(r.st.Slots) && failed == nil; i++ {
		sl := &r.st.Slots[i]
		if sl.UsedBy == nil {
			continue
		}
		done, err := c.handOver(sl)
		if err != nil {
			failed = err
			continue
		}
		if done {
			r.st.Slots = slices.Delete(r.st.Slots, i, i+1)
			i--
		}
	}
	if err := r.save(); err != nil {
		return reserveError("sync", err)
	}
	return failed
}

// handOver asks the service to bind the slot's addresses to the Pod that
// holds them. done: the slot is no longer the node's reserve (handed over,
// or refused for good, which it reports on stderr).
func (c *call) handOver(sl *reserveSlot) (done bool, err error) {
	u := sl.UsedBy
	req := c.leaseRequest(u.ContainerID, u.IfName, u.Owner, false)
	req.FromReserve = &ipamclient.ReserveHandover{ContainerID: slotContainerID(sl.ID), Interface: reserveInterface, Generation: sl.Generation}
	resp, err := c.client.AllocateLeaseWithResponse(c.ctx, c.cfg.node, &ipamclient.AllocateLeaseParams{Space: c.space()}, req)
	if err != nil {
		return false, transportError("reserve: hand over", err)
	}
	got := resp.JSON201
	if got == nil {
		got = resp.JSON200
	}
	if got == nil {
		e := problemError("reserve: hand over", resp.StatusCode(), resp.Body)
		if e.Code == types.ErrTryAgainLater {
			return false, e
		}
		fmt.Fprintf(os.Stderr, "ipam-shim: the service refused to hand reserve slot %d (%v) over to %s/%s: %v\n",
			sl.ID, addressesOf(sl.Addresses), u.ContainerID, u.IfName, e)
		return true, nil
	}
	if want, have := addressesOf(sl.Addresses), addressesOf(got.Addresses); !slices.Equal(want, have) {
		fmt.Fprintf(os.Stderr, "ipam-shim: %s/%s holds reserve addresses %v but the service answered %v\n",
			u.ContainerID, u.IfName, want, have)
	}
	return true, nil
}

func addressesOf(as []ipamclient.LeaseAddress) []string {
	out := make([]string, len(as))
	for i, a := range as {
		out[i] = a.Address
	}
	slices.Sort(out)
	return out
}

// refillReserve tops the reserve up to its size, and releases free slots
// beyond it, when the file says so; it does not wait for another call's
// lock (that call refills). Errors are left for the next call: the verb
// that reached the service succeeded.
func (c *call) refillReserve() {
	st, err := readReserve(c.cfg.dataDir)
	if err != nil || st.free() == c.cfg.reserve {
		return
	}
	r, err := lockReserve(c.cfg.dataDir, 0)
	if err != nil {
		return
	}
	defer r.close()
	_ = c.refillLocked(r)
}

// refillLocked is refillReserve holding r.
func (c *call) refillLocked(r *reserveFile) error {
	defer func() { _ = r.save() }()
	for r.st.free() > c.cfg.reserve {
		i := slices.IndexFunc(r.st.Slots, func(sl reserveSlot) bool { return sl.isFree() })
		if err := c.releaseSlot(r.st.Slots[i]); err != nil {
			return err
		}
		r.st.Slots = slices.Delete(r.st.Slots, i, i+1)
	}
	for r.st.free() < c.cfg.reserve {
		id := r.st.nextID()
		req := c.leaseRequest(slotContainerID(id), reserveInterface,
			ipamclient.Owner{Namespace: reserveOwnerNamespace, Name: containerLabel(c.cfg.net.Name)}, false)
		resp, err := c.client.AllocateLeaseWithResponse(c.ctx, c.cfg.node, &ipamclient.AllocateLeaseParams{Space: c.space()}, req)
		if err != nil {
			return err
		}
		got := resp.JSON201
		if got == nil {
			got = resp.JSON200 // the slot's lease survived the file
		}
		if got == nil || got.State != ipamclient.Active {
			return problemError("reserve: lease", resp.StatusCode(), resp.Body)
		}
		r.st.Slots = append(r.st.Slots, reserveSlot{ID: id, Generation: got.Generation, Addresses: got.Addresses})
	}
	return nil
}

// releaseSlot releases the slot's lease at the service, if it still has
// the slot's generation (nothing held is released too).
func (c *call) releaseSlot(sl reserveSlot) error {
	g := sl.Generation
	resp, err := c.client.ReleaseAttachmentWithResponse(c.ctx, c.cfg.node, slotContainerID(sl.ID), reserveInterface,
		&ipamclient.ReleaseAttachmentParams{Space: c.space(), Network: c.network(), Generation: &g})
	if err != nil {
		return transportError("reserve: release", err)
	}
	if resp.StatusCode() != http.StatusNoContent && !isNotFound(resp.StatusCode(), resp.Body) {
		return problemError("reserve: release", resp.StatusCode(), resp.Body)
	}
	return nil
}

// reserveAttachments are the slots' attachments, which GC must keep.
func (s *reserveState) attachments() []ipamclient.AttachmentRef {
	out := make([]ipamclient.AttachmentRef, len(s.Slots))
	for i, sl := range s.Slots {
		out[i] = ipamclient.AttachmentRef{ContainerID: slotContainerID(sl.ID), Interface: reserveInterface}
	}
	return out
}

// reserveReady reports whether the reserve can serve an ADD now.
func (c *call) reserveReady() bool {
	if c.cfg.reserve == 0 {
		return false
	}
	st, err := readReserve(c.cfg.dataDir)
	return err == nil && st.free() > 0
}
