package main

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

// faults is the misbehaviour FAKE_SGLANG asks for.
type faults struct {
	slowStart     time.Duration
	oom           string // "", "cuda" or "kv"
	cudaGraphFail bool
	exitOnStart   bool
	crashAfter    time.Duration
	ignoreSIGTERM bool
	children      int
	setsidChild   bool
	holdPort      bool
	loop          bool
	hybrid        bool
	// wedge: once ready for wedgeAfter, the engine hangs (a hung collective, a
	// deadlocked scheduler) while the HTTP front end keeps answering /health.
	wedge      bool
	wedgeAfter time.Duration
	// busy: the engine is slow but progressing: /health_generate answers only after
	// busyProbe, while batch lines and token counters keep moving.
	busy      bool
	busyProbe time.Duration
	// load: read the checkpoint's pages at start as SGLang's loader does (load.go).
	load bool
}

func parseFaults(s string) (faults, error) {
	var f faults
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		key, val, _ := strings.Cut(item, "=")
		var err error
		switch key {
		case "slow-start":
			f.slowStart, err = time.ParseDuration(val)
		case "oom":
			switch val {
			case "", "cuda":
				f.oom = "cuda"
			case "kv":
				f.oom = "kv"
			default:
				err = fmt.Errorf("want oom, oom=cuda or oom=kv")
			}
		case "cuda-graph-fail":
			f.cudaGraphFail = true
		case "exit-on-start":
			f.exitOnStart = true
		case "crash-after":
			f.crashAfter, err = time.ParseDuration(val)
		case "ignore-sigterm":
			f.ignoreSIGTERM = true
		case "children":
			f.children, err = strconv.Atoi(val)
			if err == nil && (f.children < 0 || f.children > 64) {
				err = fmt.Errorf("want 0..64")
			}
		case "setsid-child":
			f.setsidChild = true
		case "hold-port":
			f.holdPort = true
		case "loop":
			f.loop = true
		case "hybrid":
			f.hybrid = true
		case "load":
			f.load = true
		case "wedge":
			f.wedge = true
			if val != "" {
				f.wedgeAfter, err = time.ParseDuration(val)
			}
		case "busy":
			f.busy, f.busyProbe = true, 12*time.Second
			if val != "" {
				f.busyProbe, err = time.ParseDuration(val)
			}
		default:
			err = fmt.Errorf("unknown fault")
		}
		if err != nil {
			return f, fmt.Errorf("FAKE_SGLANG item %q: %w", item, err)
		}
	}
	return f, nil
}
