package main

import (
	"os"
	"path/filepath"
)

// jitCaches stands in for the kernels Triton, TorchInductor and FlashInfer compile on a
// first start and find again on the next: a real start reuses them and saves minutes.
// The fake compiles a marker file into each cache directory its environment names and
// says, in its log, whether a previous launch had left one there, so that a test can
// prove a relaunch found the caches of the generation before it.
func (s *server) jitCaches() {
	for _, v := range []string{"TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"} {
		dir := os.Getenv(v)
		if dir == "" {
			s.log.rank(0, "fake-sglang: %s unset: JIT kernels compiled under /tmp", v)
			continue
		}
		kernel := filepath.Join(dir, "fake-kernel.bin")
		if _, err := os.Stat(kernel); err == nil {
			s.log.rank(0, "fake-sglang: JIT cache reused: %s", kernel)
			continue
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			s.log.rank(0, "fake-sglang: JIT cache not writable: %v", err)
			continue
		}
		if err := os.WriteFile(kernel, []byte("compiled\n"), 0o644); err != nil {
			s.log.rank(0, "fake-sglang: JIT cache not writable: %v", err)
			continue
		}
		s.log.rank(0, "fake-sglang: JIT kernels compiled into %s", kernel)
	}
}
