// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package ec2fake

import (
	"bytes"
	"math/rand/v2"
	"net/http"
	"slices"
	"time"
)

// Faults after the change: EC2 can apply a call and then fail to tell the
// caller. The answer may be a 5xx, the connection may break, the answer
// may come late or never. The AWS SDK retries 5xx answers and broken
// connections, so the retry meets the changed state and gets EC2's
// answer for that state: an unassign retried after it took effect is
// answered InvalidParameterValue "not assigned", a detach retried after
// the detach finished InvalidAttachmentID.NotFound. A caller that takes
// such an error for "nothing happened" is wrong, and these faults are
// how a test shows it.

// FaultKind names a fault the fake injected.
type FaultKind string

const (
	// FaultNone is no fault: the answer goes out as it is.
	FaultNone FaultKind = ""
	// FaultRefused counts calls the SetFault hook refused (nothing
	// applied).
	FaultRefused FaultKind = "refused"
	// FaultThrottled counts calls refused RequestLimitExceeded by the
	// rates of SetFaultRates (nothing applied).
	FaultThrottled FaultKind = "throttled"
	// FaultError: the call was applied, then answered an error (a 5xx
	// by default) instead of its answer.
	FaultError FaultKind = "error"
	// FaultCut: the call was applied, then the connection was closed
	// without an answer.
	FaultCut FaultKind = "cut"
	// FaultHang: the call was applied, and its answer held for Hold
	// (or until the caller gave up) before it went out.
	FaultHang FaultKind = "hang"
	// FaultLost: the call was applied and its answer dropped: the
	// connection stays silent for Hold (or until the caller gives up),
	// then is closed.
	FaultLost FaultKind = "lost"
)

// AfterFault is what happens to a call's answer once the call was
// applied. The zero value delivers the answer.
type AfterFault struct {
	Kind FaultKind
	// Err is answered by FaultError; nil answers InternalError (500).
	Err *APIError
	// Hold is how long FaultHang holds the answer and FaultLost keeps
	// the connection silent; the wait ends early when the caller gives
	// up (its connection closes) or the fake is closed. Zero: until
	// the caller gives up or Close.
	Hold time.Duration
}

// InternalError is EC2's answer to a call that failed inside EC2.
func InternalError() *APIError {
	return &APIError{Status: http.StatusInternalServerError, Code: "InternalError", Message: "An internal error has occurred."}
}

// ServiceUnavailable is EC2's answer when a temporary failure of the
// server failed the request.
func ServiceUnavailable() *APIError {
	return &APIError{Status: http.StatusServiceUnavailable, Code: "ServiceUnavailable", Message: "The request has failed due to a temporary failure of the server."}
}

// FaultRates are the chances, per call, of each fault, drawn from a
// seeded generator so a run repeats. One draw decides a call: Throttle
// first (refused before anything is applied), then the faults after the
// change, in the order of the fields. Their sum must not exceed 1.
type FaultRates struct {
	Throttle float64 // RequestLimitExceeded (503), nothing applied
	Error    float64 // applied, then InternalError (500)
	Cut      float64 // applied, then the connection closed
	Lost     float64 // applied, the answer dropped for Hold, then cut
	Hang     float64 // applied, the answer held for Hold
	// Hold is Lost's and Hang's AfterFault.Hold.
	Hold time.Duration
	// Actions limits the faults to these actions; empty: every action.
	Actions []string
}

// SetAfterFault makes f decide, after each call was applied (or
// refused with its own error), what becomes of its answer. nil removes
// the hook. It runs after the SetFault hook let the call through and
// before the rates of SetFaultRates; a FaultNone answer lets the rates
// decide. f runs with the fake's lock held: it must not call the fake.
func (s *Server) SetAfterFault(f func(action string) AfterFault) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.after = f
}

// SetFaultRates injects faults at random by rates, from a generator
// seeded with seed. A zero FaultRates removes them.
func (s *Server) SetFaultRates(seed uint64, r FaultRates) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.rates = r
	s.rateRNG = rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
}

// Faults answers how many faults of kind the fake injected.
func (s *Server) Faults(kind FaultKind) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.faults[kind]
}

// Close ends every held answer (FaultHang, FaultLost) at once, so a
// test server's Close, which waits for its handlers, does not wait for
// them. The fake keeps answering calls without holds afterwards.
func (s *Server) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		s.closed = true
		close(s.done)
	}
}

// drawLocked decides a call's fault by the rates: FaultThrottled, an
// after fault, or FaultNone.
func (s *Server) drawLocked(action string) AfterFault {
	r := s.rates
	if s.rateRNG == nil || (len(r.Actions) > 0 && !slices.Contains(r.Actions, action)) {
		return AfterFault{}
	}
	u := s.rateRNG.Float64()
	for _, c := range []struct {
		p    float64
		kind FaultKind
	}{{r.Throttle, FaultThrottled}, {r.Error, FaultError}, {r.Cut, FaultCut}, {r.Lost, FaultLost}, {r.Hang, FaultHang}} {
		if u < c.p {
			return AfterFault{Kind: c.kind, Hold: r.Hold}
		}
		u -= c.p
	}
	return AfterFault{}
}

// answer is a call's answer, encoded while the lock was held.
type answer struct {
	status int
	body   []byte
}

func (a answer) write(w http.ResponseWriter) {
	w.Header().Set("Content-Type", "text/xml;charset=UTF-8")
	w.WriteHeader(a.status)
	_, _ = w.Write(a.body)
}

// deliver sends a, or what fault f makes of it. It runs without the
// fake's lock, so a held answer holds nothing else.
func (s *Server) deliver(w http.ResponseWriter, r *http.Request, a answer, f AfterFault) {
	switch f.Kind {
	case FaultError:
		e := f.Err
		if e == nil {
			e = InternalError()
		}
		encodeError(e).write(w)
	case FaultCut:
		cut(w)
	case FaultHang:
		if s.hold(r, f.Hold) {
			a.write(w)
		}
	case FaultLost:
		s.hold(r, f.Hold)
		cut(w)
	default:
		a.write(w)
	}
}

// hold waits d (zero: without end) and reports whether the caller is
// still there; it ends early when the caller gives up or on Close.
func (s *Server) hold(r *http.Request, d time.Duration) bool {
	var timeout <-chan time.Time
	if d > 0 {
		t := time.NewTimer(d)
		defer t.Stop()
		timeout = t.C
	}
	select {
	case <-timeout:
		return r.Context().Err() == nil
	case <-s.done:
		return r.Context().Err() == nil
	case <-r.Context().Done():
		return false
	}
}

// cut closes the call's connection without an answer: the caller sees
// its request fail with the connection broken, as when a network path
// drops after EC2 applied the call.
//
// The connection is taken from the server (Hijack) before it is closed,
// and nothing is written to it: net/http then neither writes a response
// on it nor keeps it for another request, and httptest stops tracking it.
func cut(w http.ResponseWriter) {
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		// Not hijackable (HTTP/2): abort the stream instead.
		panic(http.ErrAbortHandler)
	}
	_ = conn.Close()
}

// encodeError is e as EC2 answers it.
func encodeError(e *APIError) answer {
	var b bytes.Buffer
	writeErrorBody(&b, e)
	status := e.Status
	if status == 0 {
		status = http.StatusBadRequest
	}
	return answer{status: status, body: b.Bytes()}
}
