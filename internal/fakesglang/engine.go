package main

import (
	"net/http"
	"os"
	"strconv"
	"time"
)

// The engine behind the front end: in SGLang the HTTP server (tokenizer manager) and
// the scheduler are separate processes, so the front end can keep answering while
// the scheduler is wedged. The fake reproduces the two cases a liveness check must
// tell apart (issue 26):
//
//   - wedged (FAKE_SGLANG=wedge[=DUR], or SIGUSR1 at any time): /health stays a plain
//     200 (SGLang's older /health, or newer with SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION
//     off), while /health_generate and every generation hang, batch lines stop and the
//     token counters freeze; requests that hang are counted as queued.
//   - busy (FAKE_SGLANG=busy[=DUR], default 12s): slow but progressing: /health_generate
//     answers only after DUR, while batch lines and counters keep moving.

// healthCheckTimeout is SGLang's HEALTH_CHECK_TIMEOUT: how long /health_generate waits
// for any output of the detokenizer before it answers 503
// (python/sglang/srt/entrypoints/http_server.py, SGLANG_HEALTH_CHECK_TIMEOUT, 20 s).
func healthCheckTimeout() time.Duration {
	if v, err := strconv.Atoi(os.Getenv("SGLANG_HEALTH_CHECK_TIMEOUT")); err == nil && v > 0 {
		return time.Duration(v) * time.Second
	}
	return 20 * time.Second
}

// wedgeNow hangs the engine for the rest of the process's life. A hang is silent:
// SGLang prints nothing when a collective stops returning.
func (s *server) wedgeNow() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.wedged {
		s.wedged = true
		s.wedgedAt = time.Now()
	}
}

func (s *server) isWedged() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.wedged
}

// hang blocks a request on a wedged engine until its client gives up, counted as
// queued meanwhile (the tokenizer manager has sent it; the scheduler never takes it).
func (s *server) hang(r *http.Request, limit time.Duration) {
	s.mu.Lock()
	s.hung++
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.hung--
		s.mu.Unlock()
	}()
	var timeout <-chan time.Time
	if limit > 0 {
		timeout = time.After(limit)
	}
	select {
	case <-r.Context().Done():
	case <-timeout:
	}
}

// healthGenerate is SGLang's /health_generate: 503 while starting; otherwise a
// one-token generation, healthy as soon as the detokenizer answers anything, 503 with
// SGLang's error line after HEALTH_CHECK_TIMEOUT without an answer.
func (s *server) healthGenerate(w http.ResponseWriter, r *http.Request) {
	if !s.isReady() {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	tic := time.Now()
	switch {
	case s.isWedged():
		limit := healthCheckTimeout()
		s.hang(r, limit)
		if time.Since(tic) < limit {
			return // the client gave up first
		}
		s.mu.Lock()
		last := s.wedgedAt
		s.mu.Unlock()
		s.log.main("Health check failed. Server couldn't get a response from detokenizer for last %d seconds. tic start time: %s. last_heartbeat time: %s",
			int(limit/time.Second), tic.Format("15:04:05"), last.Format("15:04:05"))
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	case s.faults.busy:
		select {
		case <-r.Context().Done():
			return
		case <-time.After(s.faults.busyProbe):
		}
	}
	w.WriteHeader(http.StatusOK)
}
