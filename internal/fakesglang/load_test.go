package main

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/agent-dev/agent/internal/engines"
	"github.com/agent-dev/agent/internal/testbin"
	"github.com/agent-dev/agent/internal/warm"
)

// coldModel writes a two-shard checkpoint and a draft model's pt file, all evicted
// from the page cache.
func coldModel(t *testing.T) (model, draft string, files []string) {
	t.Helper()
	model, draft = t.TempDir(), t.TempDir()
	files, err := testbin.WriteWeights(model, 2, 12<<20)
	if err != nil {
		t.Fatal(err)
	}
	pt := filepath.Join(draft, "pytorch_model.bin")
	if err := os.WriteFile(pt, []byte(strings.Repeat("draft weights ", 300_000)), 0o644); err != nil {
		t.Fatal(err)
	}
	files = append(files, pt)
	for _, f := range files {
		if err := warm.Evict(f); err != nil {
			t.Fatal(err)
		}
	}
	return model, draft, files
}

// TestLoadReadsTheCheckpoint: FAKE_SGLANG=load reads every page of the model's shards
// and of the draft model before it is ready, and says so in SGLang's progress lines;
// without it the fake reads none.
func TestLoadReadsTheCheckpoint(t *testing.T) {
	t.Parallel()
	ctx := ctxWait(t)
	for _, mode := range []string{"load", ""} {
		model, draft, files := coldModel(t)
		p := launch(t, mode, "--model-path", model, "--speculative-algorithm", "EAGLE", "--speculative-draft-model-path", draft)
		p.waitLog(ctx, t, engines.SGLangReadyLine)
		for _, f := range files {
			st, _ := os.Stat(f)
			r, err := warm.Resident(f)
			if err != nil {
				t.Fatal(err)
			}
			// A page or two may go from the page cache of this VM with memory to spare.
			if loaded := r > st.Size()-1<<20; loaded != (mode == "load") {
				t.Errorf("FAKE_SGLANG=%q: %d of %s's %d bytes resident once ready", mode, r, f, st.Size())
			}
		}
		if mode != "load" {
			continue
		}
		log := p.logText()
		for _, want := range []string{"Loading safetensors checkpoint shards: 100% Completed | 2/2 [00:", "Loading pt checkpoint shards: 100% Completed | 1/1 [00:"} {
			if !strings.Contains(log, want) {
				t.Errorf("log lacks %q", want)
			}
		}
	}
}

// TestTensorRangesInNameOrder: the fake touches a shard tensor by tensor in the order
// of their names, as safe_open's keys() gives them, covering the data and nothing else.
func TestTensorRangesInNameOrder(t *testing.T) {
	files, err := testbin.WriteWeights(t.TempDir(), 1, 40<<20)
	if err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(files[0])
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, _ := f.Stat()
	ranges, err := tensorRanges(f, st.Size())
	if err != nil {
		t.Fatal(err)
	}
	var covered int64
	for _, r := range ranges {
		covered += r[1] - r[0]
	}
	if want := int64(40 << 20); covered != want {
		t.Errorf("tensors cover %d bytes, want %d", covered, want)
	}
	if slices.IsSortedFunc(ranges, func(a, b [2]int64) int { return int(a[0] - b[0]) }) {
		t.Errorf("ranges in data order %v; the writer names tensors out of it, so name order differs", ranges)
	}
}

// TestLoadRejectsABadHeader: a shard whose header safe_open cannot read fails the start
// with safetensors' own words.
func TestLoadRejectsABadHeader(t *testing.T) {
	t.Parallel()
	ctx := ctxWait(t)
	model := t.TempDir()
	if err := os.WriteFile(filepath.Join(model, "model.safetensors"), make([]byte, 1<<20), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(model, "model.safetensors"), []byte("\xff\xff\xff\xff\xff\xff\xff\x7fjunk"), 0o644); err != nil {
		t.Fatal(err)
	}
	p := launch(t, "load", "--model-path", model)
	if code := p.waitExit(ctx, t); code != 1 {
		t.Errorf("exit %d, want 1", code)
	}
	if want := "safetensors_rust.SafetensorError: Error while deserializing header: HeaderTooLarge"; !strings.Contains(p.logText(), want) {
		t.Errorf("log lacks %q", want)
	}
}
