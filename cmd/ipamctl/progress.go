// SPDX-License-Identifier: Apache-2.0
// Copyright The ipam-dev/ipam Authors

package main

import (
	"fmt"
	"io"
	"sync"
	"time"
)

// progress is one status line on stderr for an operation that may take a
// while (a consistency check of a large database, thousands of history
// events page by page). It writes only when stderr is a terminal: on a
// pipe or in a file, carriage returns would be noise in a log, and stdout
// stays clean either way.
type progress struct {
	w     io.Writer
	on    bool
	delay time.Duration
	now   func() time.Time

	mu    sync.Mutex // guards shown, against the ticker of during
	shown bool
}

func (a *app) progress() *progress {
	return &progress{w: a.stderr, on: a.isTerminal(a.stderr), delay: a.progressDelay, now: a.now}
}

// clearLine returns the cursor to the line's start and erases the line.
const clearLine = "\r\x1b[K"

// set replaces the status line.
func (p *progress) set(format string, args ...any) {
	if !p.on {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	fmt.Fprintf(p.w, clearLine+format, args...)
	p.shown = true
}

// done erases the status line, so that what follows on the terminal
// starts on a clean line.
func (p *progress) done() {
	if !p.on {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.shown {
		_, _ = io.WriteString(p.w, clearLine)
		p.shown = false
	}
}

// during runs fn, showing label and the time spent once fn has run for
// the delay; a single long request has no other progress to show.
func (p *progress) during(label string, fn func() error) error {
	if !p.on {
		return fn()
	}
	start := p.now()
	if p.delay <= 0 {
		p.set("%s…", label) // no delay asked: at once, not at the first tick
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		select {
		case <-stop:
			return
		case <-time.After(p.delay):
		}
		tick := time.NewTicker(100 * time.Millisecond)
		defer tick.Stop()
		for {
			p.set("%s… %.1fs", label, p.now().Sub(start).Seconds())
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()
	err := fn()
	close(stop)
	wg.Wait()
	p.done()
	return err
}
