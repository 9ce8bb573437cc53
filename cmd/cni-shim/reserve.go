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
	"sync"
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
	// defaultSyncLinger is how long a background sync waits for more
	// work before it exits (syncLinger); maxSyncLinger bounds it.
	defaultSyncLinger = 2 * time.Second
	maxSyncLinger     = time.Minute
)

// reserveState is the content of the reserve file.
type reserveState struct {
	Slots []reserveSlot `json:"slots"`
	// Dels are attachments released while the service was unreachable, in
	// order; they are released at the service before any handover.
	Dels []pendingDel `json:"dels,omitempty"`
	// Takes counts the slots taken, to order their handovers.
	Takes int64 `json:"takes,omitempty"`
}

// reserveSlot is one address set leased to the node in advance.
type reserveSlot struct {
	ID         int                       `json:"id"`
	Generation int64                     `json:"generation"`
	Addresses  []ipamclient.LeaseAddress `json:"addresses"`
	// Request is what the slot was leased for (requestKey): a slot serves
	// only a configuration that would lease the same, so a changed pool
	// never hands out the old pool's addresses.
	Request string `json:"request,omitempty"`
	// UsedBy is the Pod the slot was given to and not handed over to
	// yet; nil while the slot is free.
	UsedBy *reserveUse `json:"usedBy,omitempty"`
	// Taken orders the slots' handovers as their Pods took them
	// (Takes when taken).
	Taken int64 `json:"taken,omitempty"`
	// Deleted is a slot whose Pod (UsedBy) stopped before its handover:
	// its addresses are not given to another Pod from the node (the
	// service's cooldown has not run for them); the next sync hands them
	// over to the Pod and releases them, so the history sees the Pod and
	// the addresses cool down at the service as any other, and a new
	// slot takes its place.
	Deleted bool `json:"deleted,omitempty"`
	// Refused is a slot the service refused for good to hand over to its
	// Pod (UsedBy): its addresses stay the reserve's lease at the
	// service, so nobody else gets them while the Pod runs, and the sync
	// releases it once the Pod stopped (Deleted).
	Refused bool `json:"refused,omitempty"`
	// Returned is a slot to release at the service without a Pod: one
	// beyond the reserve's size, or (written by older shims) one whose
	// Pod stopped before its handover.
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
	return slices.ContainsFunc(s.Slots, func(sl reserveSlot) bool {
		return (sl.UsedBy != nil && (!sl.Refused || sl.Deleted)) || sl.Returned
	})
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
		if u := s.Slots[i].UsedBy; u != nil && !s.Slots[i].Deleted && u.ContainerID == containerID && u.IfName == ifname {
			return &s.Slots[i]
		}
	}
	return nil
}

// pendingFor reports work of the sync for containerID/ifname that must
// reach the service before the attachment's next lease: a DEL, or a
// stopped Pod's slot to hand over and release.
func (s *reserveState) pendingFor(containerID, ifname string) bool {
	if slices.Contains(s.Dels, pendingDel{ContainerID: containerID, IfName: ifname}) {
		return true
	}
	return slices.ContainsFunc(s.Slots, func(sl reserveSlot) bool {
		return sl.Deleted && sl.UsedBy != nil && sl.UsedBy.ContainerID == containerID && sl.UsedBy.IfName == ifname
	})
}

// freeFor counts the free slots leased for request.
func (s *reserveState) freeFor(request string) int {
	n := 0
	for i := range s.Slots {
		if s.Slots[i].isFree() && s.Slots[i].Request == request {
			n++
		}
	}
	return n
}

// take gives the free slot leased for request with the lowest id to use;
// nil when none is free.
func (s *reserveState) take(use reserveUse, request string) *reserveSlot {
	var best *reserveSlot
	for i := range s.Slots {
		if s.Slots[i].isFree() && s.Slots[i].Request == request && (best == nil || s.Slots[i].ID < best.ID) {
			best = &s.Slots[i]
		}
	}
	if best != nil {
		s.Takes++
		best.UsedBy, best.Taken = &use, s.Takes
	}
	return best
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
	f, err := flockFile(dir, "lock", wait)
	if err != nil {
		return nil, err
	}
	r := &reserveFile{dir: dir, lock: f}
	if r.st, err = readReserve(dir); err != nil {
		r.close()
		return nil, err
	}
	return r, nil
}

// flockFile opens dir/name (both created if missing) and takes its
// exclusive flock, waiting at most wait; a lock still held then answers
// errLocked. The lock is the open file's: it goes with the file's last
// descriptor, in this process or a child that inherited it.
func flockFile(dir, name string, wait time.Duration) (*os.File, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	f, err := os.OpenFile(filepath.Join(dir, name), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	if err == nil {
		return f, nil
	}
	if !errors.Is(err, syscall.EWOULDBLOCK) || wait <= 0 {
		_ = f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			err = errLocked
		}
		return nil, err
	}
	// Another shim holds it for a few file operations, or for a sync:
	// wait in the kernel's queue (no polling, first come first served),
	// at most wait. A wait given up on releases the lock when it is
	// granted after all.
	got := make(chan error, 1)
	var mu sync.Mutex
	abandoned := false
	go func() {
		var err error
		for {
			if err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX); !errors.Is(err, syscall.EINTR) {
				break
			}
		}
		mu.Lock()
		defer mu.Unlock()
		if abandoned {
			_ = f.Close()
			return
		}
		got <- err
	}()
	t := time.NewTimer(wait)
	defer t.Stop()
	select {
	case err = <-got:
	case <-t.C:
		mu.Lock()
		select {
		case err = <-got: // granted meanwhile
		default:
			abandoned = true
			err = errLocked
		}
		mu.Unlock()
		if abandoned {
			return nil, err
		}
	}
	if err != nil {
		_ = f.Close()
		return nil, err
	}
	return f, nil
}

var errLocked = errors.New("the reserve is locked by another call")

// save writes the state: a new file renamed over the old one, so a crash
// of the process leaves the old state or the new one. Durable also syncs
// the file and the directory, so that a crash of the node does too; the
// fast path's saves are not durable, and the sync makes them so before
// the service learns of them (see syncFile).
func (r *reserveFile) save(durable bool) error {
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
	if durable {
		if err := tmp.Sync(); err != nil {
			_ = tmp.Close()
			return err
		}
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), reservePath(r.dir)); err != nil {
		return err
	}
	if !durable {
		return nil
	}
	return syncDir(r.dir)
}

// syncFile makes the reserve file of dir durable as it is now: its data,
// then the directory entry. The file is replaced whole by rename and only
// the sync removes or frees slots, so a newer file than the one synced
// holds every slot taken in this one.
func syncFile(dir string) error {
	f, err := os.Open(reservePath(dir))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	err = f.Sync()
	_ = f.Close()
	if err != nil {
		return err
	}
	return syncDir(dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
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
		if sl = r.st.take(reserveUse{ContainerID: containerID, IfName: ifname, Owner: owner}, c.cfg.requestKey()); sl == nil {
			var e *types.Error
			if errors.As(cause, &e) {
				e2 := *e
				e2.Msg += "; the node's address reserve is empty"
				return nil, &e2
			}
			return nil, cause
		}
		if err := r.save(true); err != nil {
			return nil, reserveError("add", err)
		}
	}
	return &ipamclient.Allocation{Addresses: sl.Addresses, Generation: sl.Generation}, nil
}

// delOffline records a DEL the service could not take: a slot serving the
// attachment is marked deleted (handed over and released at the service
// by the next sync, so its addresses cool down there before another Pod
// gets them), else the DEL is replayed later (the service may hold the
// attachment: an ADD whose answer was lost).
func (c *call) delOffline(containerID, ifname string) error {
	return c.recordDel(containerID, ifname, false)
}

// recordDel records the DEL of containerID/ifname in the reserve file for
// the sync to send. fast:
// the DEL of the fast path, which does not wait for the disk (see
// reserveFile.save) and starts the background sync.
func (c *call) recordDel(containerID, ifname string, fast bool) error {
	r, err := lockReserve(c.cfg.dataDir, lockWait)
	if err != nil {
		return reserveError("del", err)
	}
	var syncLock *os.File
	defer func() {
		r.close()
		if syncLock != nil {
			c.spawn(syncLock)
		}
	}()
	if sl := r.st.servedSlot(containerID, ifname); sl != nil {
		// The sync hands the slot over to the Pod, then releases it.
		sl.Deleted = true
	} else if d := (pendingDel{ContainerID: containerID, IfName: ifname}); !slices.Contains(r.st.Dels, d) {
		// An equal DEL still to be sent covers this one: no slot is
		// handed over to the attachment in between (one that served
		// it is released with its handover).
		r.st.Dels = append(r.st.Dels, d)
	}
	if err := r.save(!fast); err != nil {
		return reserveError("del", err)
	}
	if fast {
		syncLock = c.syncLockIfFree() // started once the file's lock is let go
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

// handOver asks the service to bind the slot's addresses to the Pod that
// holds them, and answers the generation of the Pod's leases; 0 when the
// service refused for good, which it reports on stderr. Either way the
// slot is no longer the node's reserve unless err is set.
func (c *call) handOver(sl *reserveSlot) (generation int64, err error) {
	u := sl.UsedBy
	req := c.leaseRequest(u.ContainerID, u.IfName, u.Owner, false)
	req.FromReserve = &ipamclient.ReserveHandover{ContainerID: slotContainerID(sl.ID), Interface: reserveInterface, Generation: sl.Generation}
	resp, err := c.client.AllocateLeaseWithResponse(c.ctx, c.cfg.node, &ipamclient.AllocateLeaseParams{Space: c.space()}, req)
	if err != nil {
		return 0, transportError("reserve: hand over", err)
	}
	got := resp.JSON201
	if got == nil {
		got = resp.JSON200
	}
	if got == nil {
		e := problemError("reserve: hand over", resp.StatusCode(), resp.Body)
		if e.Code == types.ErrTryAgainLater {
			return 0, e
		}
		fmt.Fprintf(os.Stderr, "ipam-shim: the service refused to hand reserve slot %d (%v) over to %s/%s: %v\n",
			sl.ID, addressesOf(sl.Addresses), u.ContainerID, u.IfName, e)
		return 0, nil
	}
	if want, have := addressesOf(sl.Addresses), addressesOf(got.Addresses); !slices.Equal(want, have) {
		fmt.Fprintf(os.Stderr, "ipam-shim: %s/%s holds reserve addresses %v but the service answered %v\n",
			u.ContainerID, u.IfName, want, have)
	}
	return got.Generation, nil
}

func addressesOf(as []ipamclient.LeaseAddress) []string {
	out := make([]string, len(as))
	for i, a := range as {
		out[i] = a.Address
	}
	slices.Sort(out)
	return out
}

// releaseSlot releases the slot's lease at the service, if it still has
// the slot's generation (nothing held is released too).
func (c *call) releaseSlot(sl reserveSlot) error {
	return c.releaseHeld(slotContainerID(sl.ID), reserveInterface, sl.Generation, "reserve: release")
}

// releaseHeld releases the attachment's leases if they still have
// generation (nothing held is released too).
func (c *call) releaseHeld(containerID, ifname string, generation int64, op string) error {
	resp, err := c.client.ReleaseAttachmentWithResponse(c.ctx, c.cfg.node, containerID, ifname,
		&ipamclient.ReleaseAttachmentParams{Space: c.space(), Network: c.network(), Generation: &generation})
	if err != nil {
		return transportError(op, err)
	}
	if resp.StatusCode() != http.StatusNoContent && !isNotFound(resp.StatusCode(), resp.Body) {
		return problemError(op, resp.StatusCode(), resp.Body)
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
	return err == nil && st.freeFor(c.cfg.requestKey()) > 0
}
