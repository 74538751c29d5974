package testbin

import (
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// GroupServer is a `server` block of the fake SGLang in a rollout group, as the rollout
// (test/rollout) and fleet (test/fleet) tests declare their members: verified by
// /health, a settle and the 2+2 smoke test, stopped within 2 s. Every field but Name,
// Settle and Group is an HCL expression (`var.port`, `8001`, `"0.80"`), so a plan can
// take it from a variable or write it in.
type GroupServer struct {
	Name    string // the block's label
	Command string // the fake's path
	Port    string
	Mem     string // --mem-fraction-static
	Env     string // FAKE_SGLANG (the fake's faults); "" sets no env
	Settle  string // ready.settle, e.g. "1s"
	LogDir  string
	Group   string // rollout.group
	Max     int    // rollout.max_unavailable; 0 is 1
}

// HCL is the block.
func (s GroupServer) HCL() string {
	var b strings.Builder
	fmt.Fprintf(&b, `
server %q {
  command = [%s]
  flags = {
    "model-path"          = "Qwen/Qwen3-8B"
    "port"                = %s
    "mem-fraction-static" = %s
  }
`, s.Name, s.Command, s.Port, s.Mem)
	if s.Env != "" {
		fmt.Fprintf(&b, "  env  = { FAKE_SGLANG = %s }\n", s.Env)
	}
	fmt.Fprintf(&b, `  port = %s
  ready {
    http    = "/health"
    timeout = "60s"
    settle  = %q
  }
  stop {
    timeout = "2s"
  }
  smoke_test {
    prompt     = "What is 2+2? Answer with one number."
    max_tokens = 64
    expect     = "4"
  }
  log_dir = %s
  rollout {
    group           = %q
    max_unavailable = %d
  }
}
`, s.Port, s.Settle, s.LogDir, s.Group, max(s.Max, 1))
	return b.String()
}

// HealthWatch asks every port's /health on loopback in a loop and keeps the most that
// were down at once: what a rollout group's max_unavailable promises. A port is down
// when it refuses or /health is not 200; a probe that times out (a loaded machine) says
// nothing either way, and a round with one is not counted for the peak.
type HealthWatch struct {
	ports []int
	mu    sync.Mutex
	res   HealthResult
	stop  chan struct{}
	done  chan struct{}
}

// HealthResult is what a HealthWatch saw.
type HealthResult struct {
	Peak     int       // the most ports down at once
	PeakDown []int     // which, at the peak
	PeakTime time.Time // when the peak was first seen
	Downs    map[int]int
	Samples  int
	// FirstDown and LastDown are, per port seen down, the first and the last round
	// that saw it down: for a port down once, the span of its outage to within a round.
	FirstDown, LastDown map[int]time.Time
}

// PeakAt says which ports were down at the peak, and when.
func (r HealthResult) PeakAt() string {
	if r.Peak == 0 {
		return ""
	}
	return fmt.Sprintf("ports %v at %s", r.PeakDown, r.PeakTime.Format(time.StampMilli))
}

// WatchHealth starts a HealthWatch that begins a round every period (at once when a
// round took longer); Stop ends it.
func WatchHealth(ports []int, every time.Duration) *HealthWatch {
	tick := time.NewTicker(every)
	w := &HealthWatch{ports: ports, res: HealthResult{Downs: map[int]int{}, FirstDown: map[int]time.Time{}, LastDown: map[int]time.Time{}}, stop: make(chan struct{}), done: make(chan struct{})}
	client := &http.Client{Timeout: 2 * time.Second}
	go func() {
		defer close(w.done)
		defer tick.Stop()
		for {
			var down []int
			known := true
			for _, port := range w.ports {
				resp, err := client.Get("http://127.0.0.1:" + strconv.Itoa(port) + "/health")
				if err != nil {
					var ne net.Error
					if errors.As(err, &ne) && ne.Timeout() {
						known = false
						continue
					}
					down = append(down, port)
					continue
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					down = append(down, port)
				}
			}
			now := time.Now()
			w.mu.Lock()
			w.res.Samples++
			for _, p := range down {
				w.res.Downs[p]++
				if _, ok := w.res.FirstDown[p]; !ok {
					w.res.FirstDown[p] = now
				}
				w.res.LastDown[p] = now
			}
			if known && len(down) > w.res.Peak {
				w.res.Peak, w.res.PeakDown, w.res.PeakTime = len(down), down, now
			}
			w.mu.Unlock()
			select {
			case <-w.stop:
				return
			case <-tick.C:
			}
		}
	}()
	return w
}

// Stop ends the watch and returns what it saw.
func (w *HealthWatch) Stop() HealthResult {
	close(w.stop)
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.res
}
