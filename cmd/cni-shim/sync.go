// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/ipam-dev/ipam/api/ipamclient"
)

// The fast path and the sync.
//
// When the configuration names the pool of every family it leases (so the
// slot's pool is surely the one the service would choose) and the reserve
// has a free slot, ADD takes the slot under the file's lock and answers
// without a request, and DEL only records itself; neither waits for the
// disk (see reserveFile.save). The service learns of both from the sync:
// a process of its own (this binary again, detached, see spawn) that
// sends the recorded DELs, the releases of returned slots and the
// handovers at once, then refills the reserve. It runs as soon as the
// verb has answered, so the service's record lags by one batch.
//
// Two locks: the file's (dataDir/lock), held for a few file operations,
// and the sync's (dataDir/sync.lock), held by the one process that talks
// to the service for the reserve. Only the sync's holder removes, frees
// or adds slots; the fast path only takes free slots, returns them and
// appends DELs. A verb that changed the file starts a sync unless one
// holds the sync lock; a sync lets the lock go only under the file's
// lock and when the file holds nothing for it (see syncer.finish), so a
// change made while it ran is never left behind.

// syncLockName is the sync's lock file in dataDir.
const syncLockName = "sync.lock"

// backgroundEnv names the variable that makes the binary the sync of a
// reserve instead of a CNI call; its value is the network configuration.
// The sync lock is its descriptor 3, taken by the process that started it.
const backgroundEnv = "IPAM_SHIM_BACKGROUND_SYNC"

// maxSyncRounds bounds one sync: the verbs of the node keep adding work
// while it runs; what is left over starts the next.
const maxSyncRounds = 64

// namesPools reports whether the configuration names the pool of every
// family ADD may lease: then a slot, leased with the same request, is
// from the pool the service would choose for any Pod, and ADD may take
// it without asking. Otherwise the Pod's annotations or the pools'
// selectors may choose another pool, which only the service evaluates.
func (c *config) namesPools() bool {
	if c.pool != "" {
		return true
	}
	wanted := c.families
	if len(wanted) == 0 {
		wanted = []ipamclient.Family{ipamclient.Ipv4, ipamclient.Ipv6}
	}
	for _, f := range wanted {
		if c.pools[f] == "" {
			return false
		}
	}
	return true
}

// requestKey says what a slot leased for this configuration holds: the
// pools it names and the families it asks for.
func (c *config) requestKey() string {
	key := "pool=" + c.pool
	for _, f := range []ipamclient.Family{ipamclient.Ipv4, ipamclient.Ipv6} {
		if p, ok := c.pools[f]; ok {
			key += " " + string(f) + "=" + p
		}
	}
	if len(c.families) > 0 {
		fs := make([]string, len(c.families))
		for i, f := range c.families {
			fs[i] = string(f)
		}
		slices.Sort(fs)
		key += " families=" + strings.Join(fs, ",")
	}
	return key
}

// fastPath reports whether ADD and DEL go through the reserve first.
func (c *call) fastPath() bool { return c.cfg.reserve > 0 && c.cfg.namesPools() }

// servable reports whether the service would take the attachment and
// owner as they are (its checks of names, which the handover meets only
// after the Pod started): otherwise ADD asks it, and answers its refusal.
func servable(containerID, ifname string, owner ipamclient.Owner) bool {
	return isToken(containerID, 256) && isToken(ifname, 64) &&
		isDNSName(owner.Namespace, 63, false) && isDNSName(owner.Name, 253, true) &&
		(owner.Uid == nil || isToken(*owner.Uid, 128))
}

// isToken: printable ASCII without spaces or '/', at most max bytes.
func isToken(s string, max int) bool {
	if s == "" || len(s) > max {
		return false
	}
	for _, r := range s {
		if r <= ' ' || r > '~' || r == '/' {
			return false
		}
	}
	return true
}

// isDNSName: a DNS-1123 label, or with dots a subdomain, of at most max
// bytes.
func isDNSName(s string, max int, dots bool) bool {
	if s == "" || len(s) > max {
		return false
	}
	for _, l := range strings.Split(s, ".") {
		if l == "" || len(l) > 63 || (!dots && l != s) || l[0] == '-' || l[len(l)-1] == '-' {
			return false
		}
		for i := 0; i < len(l); i++ {
			if ch := l[i]; (ch < 'a' || ch > 'z') && (ch < '0' || ch > '9') && ch != '-' {
				return false
			}
		}
	}
	return true
}

// addFast serves ADD from a free slot of the reserve without a request:
// the slot that already serves the attachment (a retry), else the free
// one with the lowest id. nil when no slot is free: ADD asks the service.
func (c *call) addFast(containerID, ifname string, owner ipamclient.Owner) (*ipamclient.Allocation, error) {
	r, err := lockReserve(c.cfg.dataDir, lockWait)
	if err != nil {
		return nil, reserveError("add", err)
	}
	var syncLock *os.File
	defer func() {
		r.close()
		if syncLock != nil {
			c.spawn(syncLock)
		}
	}()
	sl := r.st.servedSlot(containerID, ifname)
	if sl == nil {
		if sl = r.st.take(reserveUse{ContainerID: containerID, IfName: ifname, Owner: owner}, c.cfg.requestKey()); sl == nil {
			return nil, nil
		}
		if err := r.save(false); err != nil {
			return nil, reserveError("add", err)
		}
		syncLock = c.syncLockIfFree() // started once the file's lock is let go
	}
	return &ipamclient.Allocation{Addresses: sl.Addresses, Generation: sl.Generation}, nil
}

// syncLockIfFree takes the sync lock when no sync holds it; the caller
// holds the file's lock and has saved its change, and starts the sync
// with the lock (spawn) once it has let the file's lock go. nil: a sync
// runs and sees the change (see syncer.finish), or the lock cannot be
// had and the next call starts one.
func (c *call) syncLockIfFree() *os.File {
	f, err := flockFile(c.cfg.dataDir, syncLockName, 0)
	if err != nil {
		return nil
	}
	return f
}

// spawn starts the sync in the background with the sync lock f, which it
// inherits, and closes f here. The process is detached: a session of its
// own, no standard streams but its log (dataDir/sync.log), so the runtime,
// which reads the verb's output to its end, does not wait for it. A pipe
// tells it when this process has closed its copy of f (see
// syncer.finish). When it cannot start, the work waits in the file for
// the next call.
func (c *call) spawn(f *os.File) {
	defer f.Close() //nolint:errcheck // the child holds the lock now
	exe, err := os.Executable()
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: cannot start the reserve's sync: %v; the next call syncs\n", pluginType, err)
		return
	}
	pr, pw, err := os.Pipe()
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s: cannot start the reserve's sync: %v; the next call syncs\n", pluginType, err)
		return
	}
	defer pw.Close() //nolint:errcheck // after f: the child's signal
	defer pr.Close() //nolint:errcheck // the child's copy is its own
	cmd := exec.Command(exe)
	cmd.Env = []string{backgroundEnv + "=" + string(c.stdin)}
	cmd.ExtraFiles = []*os.File{f, pr}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	cmd.Dir = "/"
	if log := openSyncLog(c.cfg.dataDir); log != nil {
		defer log.Close() //nolint:errcheck // the child's copy is its own
		cmd.Stderr = log
	}
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(os.Stderr, "%s: cannot start the reserve's sync: %v; the next call syncs\n", pluginType, err)
		return
	}
	_ = cmd.Process.Release()
}

// syncLogLimit bounds the sync's log: a longer one starts over.
const syncLogLimit = 1 << 20

// openSyncLog opens the sync's log in dir for appending, or nil.
func openSyncLog(dir string) *os.File {
	path := filepath.Join(dir, "sync.log")
	flags := os.O_WRONLY | os.O_CREATE | os.O_APPEND
	if fi, err := os.Stat(path); err == nil && fi.Size() > syncLogLimit {
		flags |= os.O_TRUNC
	}
	f, err := os.OpenFile(path, flags, 0o600)
	if err != nil {
		return nil
	}
	return f
}

// runBackground is the sync process (see spawn): it answers its exit code.
// Its errors go nowhere (no stderr): what it could not send stays in the
// file for the next call.
func runBackground(conf string) int {
	f, parent := os.NewFile(3, syncLockName), os.NewFile(4, "parent")
	cfg, err := loadConfig([]byte(conf))
	if err != nil || f == nil || parent == nil {
		return 1
	}
	// Descriptor 3 must be the sync lock of this configuration's reserve.
	fi, err1 := f.Stat()
	li, err2 := os.Stat(filepath.Join(cfg.dataDir, syncLockName))
	if err1 != nil || err2 != nil || !os.SameFile(fi, li) {
		return 1
	}
	// The runtime's work on the node comes first: the sync only tells
	// the service what the node did already.
	_ = syscall.Setpriority(syscall.PRIO_PROCESS, 0, 10)
	cl, err := newClient(cfg)
	if err != nil {
		return 1
	}
	ctx, cancel := context.WithTimeout(context.Background(), cfg.timeout)
	c := &call{cfg: cfg, client: cl, ctx: ctx, stdin: []byte(conf)}
	s := &syncer{c: c, lock: f, parent: parent, linger: cfg.syncLinger, cancel: cancel}
	defer func() { s.cancel() }()
	if err := s.drain(); err != nil {
		fmt.Fprintf(os.Stderr, "%s %s: sync: %v\n", time.Now().UTC().Format(time.RFC3339), pluginType, err)
		s.close()
		return 1
	}
	s.finish()
	return 0
}

// syncer holds the sync lock of a reserve.
type syncer struct {
	c    *call
	lock *os.File
	// parent is the pipe from the process that passed the lock (spawn):
	// its end of file says that process closed its copy of the lock.
	parent *os.File
	// refillFailed: the service refused a slot (the pool is out of
	// addresses for the node, say); no more leases until a send.
	refillFailed bool
	// linger is how long a background sync waits for more work once
	// idle (config.syncLinger); 0 in a verb's own sync.
	linger time.Duration
	// cancel ends the current round's context of a background sync.
	cancel context.CancelFunc
}

func (s *syncer) close() {
	if s != nil && s.lock != nil {
		_ = s.lock.Close()
		s.lock = nil
	}
}

// parentDone waits until the process that passed the lock has closed its
// copy: only then does closing the lock here let it go.
func (s *syncer) parentDone() {
	if s.parent != nil {
		_, _ = io.Copy(io.Discard, s.parent)
		_ = s.parent.Close()
		s.parent = nil
	}
}

// syncWork is what one round sends, copied from the file under its lock.
type syncWork struct {
	dels     []pendingDel
	returned []reserveSlot
	used     []reserveSlot
}

func workOf(st *reserveState) syncWork {
	w := syncWork{dels: slices.Clone(st.Dels)}
	for _, sl := range st.Slots {
		switch {
		case sl.Returned:
			w.returned = append(w.returned, sl)
		case sl.UsedBy != nil && (!sl.Refused || sl.Deleted):
			w.used = append(w.used, sl)
		}
	}
	// In the order their Pods took them: a Pod's stopped slot goes to it
	// (and is released) before its next slot.
	slices.SortFunc(w.used, func(a, b reserveSlot) int { return cmp.Compare(a.Taken, b.Taken) })
	return w
}

func (w syncWork) empty() bool { return len(w.dels) == 0 && len(w.returned) == 0 && len(w.used) == 0 }

// drain sends the file's work until none is left: DELs first, then the
// releases of returned slots, then the handovers. It answers the first
// error that says the service is unreachable (the rest waits for the next
// sync); a request the service refuses for good is dropped from the file
// and reported on stderr, as retrying it could never succeed.
func (s *syncer) drain() error {
	for range maxSyncRounds {
		sent, err := s.send()
		if err != nil || !sent {
			return err
		}
	}
	return nil
}

// send is one round of drain; sent reports that there was work.
func (s *syncer) send() (sent bool, err error) {
	c := s.c
	r, err := lockReserve(c.cfg.dataDir, lockWait)
	if err != nil {
		return false, reserveError("sync", err)
	}
	w := workOf(&r.st)
	r.close()
	if w.empty() {
		return false, nil
	}
	// A handover must survive a crash of the node first: a slot taken on
	// the fast path and handed over, then found free again in the file,
	// would serve a second Pod. The rest may be lost with the node: the
	// next sync sends it again, and the service answers a repeated
	// release or handover as the first.
	if len(w.used) > 0 {
		if err := syncFile(c.cfg.dataDir); err != nil {
			return false, reserveError("sync", err)
		}
	}
	var failed error
	delsDone := 0
	for _, d := range w.dels {
		resp, err := c.client.ReleaseAttachmentWithResponse(c.ctx, c.cfg.node, d.ContainerID, d.IfName,
			&ipamclient.ReleaseAttachmentParams{Space: c.space(), Network: c.network()})
		if err != nil {
			failed = transportError("reserve: replay del", err)
			break
		}
		if resp.StatusCode() != http.StatusNoContent && !isNotFound(resp.StatusCode(), resp.Body) {
			e := problemError("reserve: replay del", resp.StatusCode(), resp.Body)
			if e.Code == types.ErrTryAgainLater {
				failed = e
				break
			}
			fmt.Fprintf(os.Stderr, "ipam-shim: dropping the DEL of %s/%s: %v\n", d.ContainerID, d.IfName, e)
		}
		delsDone++
	}
	gone := map[int]int64{} // slot id: generation, no longer the reserve's
	for _, sl := range w.returned {
		if failed != nil {
			break
		}
		if err := c.releaseSlot(sl); err != nil {
			if e, ok := err.(*types.Error); !ok || e.Code == types.ErrTryAgainLater {
				failed = err
				break
			}
			fmt.Fprintf(os.Stderr, "ipam-shim: dropping returned reserve slot %d (%v): %v\n", sl.ID, addressesOf(sl.Addresses), err)
		}
		gone[sl.ID] = sl.Generation
	}
	// DELs of Pods whose slots were handed over and are still to be
	// released: they go first in the file's DELs.
	var first []pendingDel
	var refused []int // slot ids
	for _, sl := range w.used {
		if failed != nil {
			break
		}
		var gen int64
		if !sl.Refused {
			if gen, err = c.handOver(&sl); err != nil {
				failed = err
				break
			}
			if gen == 0 && !sl.Deleted {
				refused = append(refused, sl.ID)
				continue
			}
		}
		gone[sl.ID] = sl.Generation
		if !sl.Deleted {
			continue
		}
		u := sl.UsedBy
		if gen == 0 {
			// Refused: the slot's leases are still the reserve's.
			err = c.releaseSlot(sl)
		} else {
			err = c.releaseHeld(u.ContainerID, u.IfName, gen, "reserve: release a stopped Pod")
		}
		if err != nil {
			if e, ok := err.(*types.Error); !ok || e.Code == types.ErrTryAgainLater {
				first = append(first, pendingDel{ContainerID: u.ContainerID, IfName: u.IfName})
				failed = err
				break
			}
			fmt.Fprintf(os.Stderr, "ipam-shim: dropping the release of %s/%s (%v): %v\n", u.ContainerID, u.IfName, addressesOf(sl.Addresses), err)
		}
	}
	if r, err = lockReserve(c.cfg.dataDir, lockWait); err != nil {
		return true, reserveError("sync", err)
	}
	// Only the sync removes DELs (from the front) and slots, so the
	// file still holds what was sent, and what came meanwhile after it.
	// A slot handed over whose Pod stopped meanwhile leaves its DEL.
	r.st.Dels = r.st.Dels[delsDone:]
	for _, sl := range r.st.Slots {
		if g, ok := gone[sl.ID]; ok && g == sl.Generation && sl.Deleted && sl.UsedBy != nil &&
			!slices.ContainsFunc(w.used, func(u reserveSlot) bool { return u.ID == sl.ID && u.Deleted }) {
			first = append(first, pendingDel{ContainerID: sl.UsedBy.ContainerID, IfName: sl.UsedBy.IfName})
		}
	}
	r.st.Dels = append(first, r.st.Dels...)
	for i := range r.st.Slots {
		if slices.Contains(refused, r.st.Slots[i].ID) {
			r.st.Slots[i].Refused = true
		}
	}
	r.st.Slots = slices.DeleteFunc(r.st.Slots, func(sl reserveSlot) bool {
		g, ok := gone[sl.ID]
		return ok && g == sl.Generation
	})
	err = r.save(false)
	r.close()
	if err != nil {
		return true, reserveError("sync", err)
	}
	return true, failed
}

// refill tops the reserve up to its size, and returns free slots beyond
// it (released by the next send). changed reports that it did either.
func (s *syncer) refill() (changed bool, err error) {
	c := s.c
	r, err := lockReserve(c.cfg.dataDir, lockWait)
	if err != nil {
		return false, reserveError("sync", err)
	}
	// Free slots leased for another request (the configuration's pools
	// changed) go back, and those beyond the reserve's size.
	key := c.cfg.requestKey()
	for i := range r.st.Slots {
		if sl := &r.st.Slots[i]; sl.isFree() && sl.Request != key {
			sl.Returned, changed = true, true
		}
	}
	excess := r.st.free() - c.cfg.reserve
	for i := len(r.st.Slots) - 1; i >= 0 && excess > 0; i-- {
		if sl := &r.st.Slots[i]; sl.isFree() {
			sl.Returned = true
			excess--
			changed = true
		}
	}
	need := c.cfg.reserve - r.st.free()
	var ids []int // the lowest ids no slot has
	for id := 0; len(ids) < need; id++ {
		if !slices.ContainsFunc(r.st.Slots, func(sl reserveSlot) bool { return sl.ID == id }) {
			ids = append(ids, id)
		}
	}
	if changed {
		err = r.save(false)
	}
	r.close()
	if err != nil || changed || s.refillFailed || len(ids) == 0 {
		return changed, err
	}
	var added []reserveSlot
	for _, id := range ids {
		req := c.leaseRequest(slotContainerID(id), reserveInterface,
			ipamclient.Owner{Namespace: reserveOwnerNamespace, Name: containerLabel(c.cfg.net.Name)}, false)
		resp, err := c.client.AllocateLeaseWithResponse(c.ctx, c.cfg.node, &ipamclient.AllocateLeaseParams{Space: c.space()}, req)
		if err != nil {
			s.refillFailed = true
			break
		}
		got := resp.JSON201
		if got == nil {
			got = resp.JSON200 // the slot's lease survived the file
		}
		if got == nil || got.State != ipamclient.Active {
			s.refillFailed = true
			break
		}
		added = append(added, reserveSlot{ID: id, Generation: got.Generation, Addresses: got.Addresses, Request: key})
	}
	if len(added) == 0 {
		return false, nil
	}
	if r, err = lockReserve(c.cfg.dataDir, lockWait); err != nil {
		return false, reserveError("sync", err)
	}
	// Not synced to disk: slots lost with the node are leases of its
	// reserve that the file no longer lists, which the next GC releases.
	r.st.Slots = append(r.st.Slots, added...)
	err = r.save(false)
	r.close()
	return true, err
}

// finish refills the reserve and sends what the verbs recorded meanwhile
// until nothing is left, then lets the sync lock go: under the file's
// lock, after finding the file holds no work. A verb that changed the
// file while this sync held the lock (and so started none) changed it
// before that last look, which sees it.
//
// A background sync (linger > 0) first waits that long for more work,
// woken by the file's replacement (inotify), so that a burst of Pods is
// told by one process over one connection instead of one process each.
func (s *syncer) finish() {
	defer s.close()
	watch := -1
	if s.linger > 0 {
		watch = watchDir(s.c.cfg.dataDir)
		if watch >= 0 {
			defer syscall.Close(watch) //nolint:errcheck // inotify descriptor
		}
	}
	deadline := time.Now().Add(s.linger)
	for rounds := 0; rounds < maxSyncRounds; rounds++ {
		s.newRound()
		changed, err := s.refill()
		if err != nil {
			return
		}
		sent, err := s.send()
		if err != nil {
			return
		}
		if sent {
			s.refillFailed = false // released addresses may serve a refill later
		}
		if changed || sent {
			deadline = time.Now().Add(s.linger)
			continue
		}
		if watch >= 0 && time.Now().Before(deadline) {
			if st, err := readReserve(s.c.cfg.dataDir); err == nil && workOf(&st).empty() {
				if waitEvent(watch, time.Until(deadline)) {
					// The verbs of a burst come a few milliseconds
					// apart: one round tells the service of several.
					time.Sleep(batchDelay)
				}
			}
			rounds = 0
			continue
		}
		s.parentDone()
		r, err := lockReserve(s.c.cfg.dataDir, lockWait)
		if err != nil {
			return
		}
		idle := workOf(&r.st).empty() && (s.refillFailed || r.st.free() == s.c.cfg.reserve)
		if idle {
			s.close()
		}
		r.close()
		if idle {
			return
		}
	}
}

// newRound gives a background sync's round a deadline of its own.
func (s *syncer) newRound() {
	if s.cancel == nil {
		return
	}
	s.cancel()
	s.c.ctx, s.cancel = context.WithTimeout(context.Background(), s.c.cfg.timeout)
}

// watchDir watches dir for files written or renamed into it; -1 when it
// cannot (the sync then does not linger).
func watchDir(dir string) int {
	fd, err := syscall.InotifyInit1(syscall.IN_CLOEXEC | syscall.IN_NONBLOCK)
	if err != nil {
		return -1
	}
	if _, err := syscall.InotifyAddWatch(fd, dir, syscall.IN_MOVED_TO|syscall.IN_CLOSE_WRITE); err != nil {
		_ = syscall.Close(fd)
		return -1
	}
	return fd
}

// batchDelay is how long a lingering sync waits after the first change
// before it sends: the history lags by that much more.
const batchDelay = 5 * time.Millisecond

// waitEvent waits at most d for an event of the inotify descriptor fd and
// reads the events queued; it reports whether there was one.
func waitEvent(fd int, d time.Duration) bool {
	if d <= 0 {
		return false
	}
	var set syscall.FdSet
	set.Bits[fd/64] |= 1 << (uint(fd) % 64)
	tv := syscall.NsecToTimeval(d.Nanoseconds())
	if n, err := syscall.Select(fd+1, &set, nil, nil, &tv); err != nil || n == 0 {
		return false
	}
	var buf [4096]byte
	for {
		if n, err := syscall.Read(fd, buf[:]); err != nil || n <= 0 {
			return true
		}
	}
}

// beginSync takes the sync lock for a verb that asks the service (the
// slow path, STATUS, GC) and sends the recorded work first, so that the
// service sees a Pod's DEL before the same attachment's next ADD. When a
// sync runs already, the verb does not wait for it, unless it holds work
// for this attachment (containerID/ifname, empty for none; see
// reserveState.pendingFor): the verb then
// waits for its end, and answers "try again later" if it does not end in
// time. nil: no sync lock (no reserve, or another holds it).
func (c *call) beginSync(containerID, ifname string) (*syncer, error) {
	st, err := readReserve(c.cfg.dataDir)
	if err != nil || (c.cfg.reserve == 0 && len(st.Slots) == 0 && !st.pending()) {
		return nil, nil // no reserve; a broken file is reported by the calls that use it
	}
	f, err := flockFile(c.cfg.dataDir, syncLockName, 0)
	for deadline := time.Now().Add(lockWait); errors.Is(err, errLocked) && st.pendingFor(containerID, ifname); {
		// The sync that runs sends it at once: wait for that, or
		// for its lock.
		if !time.Now().Before(deadline) {
			return nil, types.NewError(types.ErrTryAgainLater,
				"the node's address reserve is still sending the DEL of "+containerID+"/"+ifname+" to the IPAM service", "")
		}
		time.Sleep(5 * time.Millisecond)
		if st, err = readReserve(c.cfg.dataDir); err != nil {
			return nil, nil
		}
		f, err = flockFile(c.cfg.dataDir, syncLockName, 0)
	}
	if err != nil {
		return nil, nil // the sync that runs sends the work
	}
	s := &syncer{c: c, lock: f}
	return s, s.drain()
}

// handOff passes the sync lock to a background sync, which refills the
// reserve after the verb has answered; without a reachable service it
// lets the lock go.
func (s *syncer) handOff(reachable bool) {
	if s == nil || s.lock == nil {
		return
	}
	if !reachable {
		s.close()
		return
	}
	f := s.lock
	s.lock = nil
	s.c.spawn(f)
}
