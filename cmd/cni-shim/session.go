// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"crypto/sha256"
	"crypto/tls"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"sync"
)

// sessionFileName is the default session cache file, next to the node's key.
const sessionFileName = "ipam-shim.sessions"

// maxSessions bounds the entries of a session file (one per server name
// and scope).
const maxSessions = 8

// fileSessionCache is a tls.ClientSessionCache kept in a file, so that the
// shim's next process (one per CNI call) resumes the TLS 1.3 session of the
// last instead of a full handshake: one round trip and the certificate
// verification less. The file holds resumption secrets, as the key next to
// it holds the node's private key: it is written with mode 0600.
//
// Many shim processes run at once. A writer writes a temporary file in the
// same directory and renames it over the cache, so a reader sees the old
// file or the new one, never a torn one; when two write at once, the last
// rename wins, which costs a cache only a full handshake later. An
// unreadable, corrupt or foreign file reads as empty, and a file that
// cannot be written leaves resumption off: the cache never fails a call.
//
// A resumed session carries the identity and the verification of the
// session it resumes: the client certificate the server saw and the
// server's chain checked against the CA of that time. So entries are kept
// per scope, a digest of the client certificate and the CA bundle: another
// node's certificate in the same directory, a renewed certificate or a new
// CA never resumes a session of the old ones.
type fileSessionCache struct {
	path  string
	scope string

	mu      sync.Mutex
	entries map[string]sessionEntry // nil until loaded
}

// sessionEntry is one resumable session: the ticket and the serialized
// tls.SessionState.
type sessionEntry struct {
	Ticket []byte `json:"ticket"`
	State  []byte `json:"state"`
}

var _ tls.ClientSessionCache = (*fileSessionCache)(nil)

// newFileSessionCache is the cache in path for sessions made with the
// client certificate cert (DER) and the CA bundle ca (PEM, nil for the
// system roots).
func newFileSessionCache(path string, cert, ca []byte) *fileSessionCache {
	h := sha256.New()
	for _, b := range [][]byte{cert, ca} {
		var n [8]byte
		binary.BigEndian.PutUint64(n[:], uint64(len(b)))
		h.Write(n[:])
		h.Write(b)
	}
	return &fileSessionCache{path: path, scope: hex.EncodeToString(h.Sum(nil))}
}

// loadLocked reads the file once.
func (c *fileSessionCache) loadLocked() {
	if c.entries != nil {
		return
	}
	c.entries = map[string]sessionEntry{}
	b, err := os.ReadFile(c.path)
	if err != nil {
		return
	}
	var m map[string]sessionEntry
	if json.Unmarshal(b, &m) == nil && len(m) <= maxSessions {
		c.entries = m
	}
}

// Get answers the session stored for key, if any parses.
func (c *fileSessionCache) Get(key string) (*tls.ClientSessionState, bool) {
	key = c.scope + " " + key
	c.mu.Lock()
	defer c.mu.Unlock()
	c.loadLocked()
	e, ok := c.entries[key]
	if !ok {
		return nil, false
	}
	state, err := tls.ParseSessionState(e.State)
	if err != nil {
		return nil, false
	}
	cs, err := tls.NewResumptionState(e.Ticket, state)
	if err != nil {
		return nil, false
	}
	return cs, true
}

// Put stores cs for key (removes it when cs is nil) and writes the file.
func (c *fileSessionCache) Put(key string, cs *tls.ClientSessionState) {
	key = c.scope + " " + key
	c.mu.Lock()
	defer c.mu.Unlock()
	c.loadLocked()
	if cs == nil {
		if _, ok := c.entries[key]; !ok {
			return
		}
		delete(c.entries, key)
	} else {
		ticket, state, err := cs.ResumptionState()
		if err != nil || state == nil {
			return
		}
		b, err := state.Bytes()
		if err != nil {
			return
		}
		if _, ok := c.entries[key]; !ok && len(c.entries) >= maxSessions {
			for k := range c.entries { // any other: one server is the usual case
				delete(c.entries, k)
				break
			}
		}
		c.entries[key] = sessionEntry{Ticket: ticket, State: b}
	}
	c.writeLocked()
}

// writeLocked replaces the file atomically; errors leave it as it was.
func (c *fileSessionCache) writeLocked() {
	b, err := json.Marshal(c.entries)
	if err != nil {
		return
	}
	f, err := os.CreateTemp(filepath.Dir(c.path), filepath.Base(c.path)+".*.tmp")
	if err != nil {
		return
	}
	tmp := f.Name()
	// CreateTemp makes the file 0600; Chmod in case the umask or the
	// file system says otherwise.
	_, werr := f.Write(b)
	cerr := f.Chmod(0o600)
	if err := f.Close(); werr != nil || cerr != nil || err != nil {
		_ = os.Remove(tmp)
		return
	}
	if err := os.Rename(tmp, c.path); err != nil {
		_ = os.Remove(tmp)
	}
}
