package engines

import (
	"strings"
	"testing"
)

func TestDetectFailure(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		log  string
		want FailureKind
		line string // a substring of the reported line
		hint string // a substring of the hint
	}{
		{
			name: "KV cache does not fit",
			log: `[2026-05-09 09:19:30 TP0] Load weight end. type=Qwen3NextForCausalLM, dtype=torch.bfloat16, avail mem=1.01 GB, mem usage=45.91 GB.
[2026-05-09 09:19:31 TP0] Scheduler hit an exception: Traceback (most recent call last):
  File "/usr/local/lib/python3.12/dist-packages/sglang/srt/model_executor/model_runner.py", line 1205, in init_memory_pool
    raise RuntimeError(
RuntimeError: Not enough memory. Please try to increase --mem-fraction-static.

[2026-05-09 09:19:31] Received sigquit from a child process. It usually means the child failed.`,
			want: FailureOOM, line: "RuntimeError: Not enough memory", hint: "--mem-fraction-static",
		},
		{
			name: "torch CUDA OOM",
			log: `[2026-05-09 09:19:31 TP1] Scheduler hit an exception: Traceback (most recent call last):
torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.95 GiB. GPU 1 has a total capacity of 47.41 GiB of which 1.12 GiB is free. Including non-PyTorch memory, this process has 46.28 GiB memory in use.`,
			want: FailureOOM, line: "CUDA out of memory", hint: "lower --mem-fraction-static",
		},
		{
			name: "OOM inside cuda graph capture names the OOM",
			log:  `Exception: Capture cuda graph failed: CUDA out of memory. Tried to allocate 4.78 GiB.`,
			want: FailureOOM, line: "Capture cuda graph failed", hint: "--cuda-graph-max-bs",
		},
		{
			name: "cuda graph capture",
			log: `[2026-05-01 12:00:00 TP0] Capture cuda graph begin. This can take up to several minutes. avail mem=6.08 GB
Exception: Capture cuda graph failed: FlashAttention only support fp16 and bf16 data type`,
			want: FailureCUDAGraph, line: "Capture cuda graph failed", hint: "--disable-cuda-graph",
		},
		{
			name: "unknown flag",
			log: `usage: launch_server.py [-h] --model-path MODEL_PATH [--port PORT]
launch_server.py: error: unrecognized arguments: --speculative-algorithmm NEXTN`,
			want: FailureBadFlag, line: "unrecognized arguments: --speculative-algorithmm", hint: "flag",
		},
		{
			name: "invalid flag value",
			log:  `launch_server.py: error: argument --tp-size/--tensor-parallel-size: invalid int value: 'two'`,
			want: FailureBadFlag, line: "invalid int value", hint: "flag",
		},
		{
			name: "scheduler crash",
			log: `[2026-05-09 10:00:00 TP0] Scheduler hit an exception: Traceback (most recent call last):
RuntimeError: CUDA error: an illegal memory access was encountered`,
			want: FailureSchedulerCrash, line: "Scheduler hit an exception", hint: "relaunched",
		},
		{
			name: "missing model",
			log:  `OSError: Can't load the configuration of '/models/nope'. If you were trying to load it from 'https://huggingface.co/models', make sure you don't have a local directory with the same name.`,
			want: FailureModelPath, line: "/models/nope", hint: "--model-path",
		},
		{
			name: "port in use",
			log:  `[2026-05-01 12:00:00] ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 30000): address already in use`,
			want: FailurePortInUse, line: "Errno 98", hint: "--port",
		},
		{
			name: "no GPU",
			log:  `RuntimeError: No CUDA GPUs are available`,
			want: FailureNoGPU, line: "No CUDA GPUs", hint: "CUDA_VISIBLE_DEVICES",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			f, ok := DetectFailure(strings.Split(tt.log, "\n"))
			if !ok {
				t.Fatal("no failure detected")
			}
			if f.Kind != tt.want || !strings.Contains(f.Line, tt.line) || !strings.Contains(f.Hint, tt.hint) {
				t.Errorf("DetectFailure = %+v, want kind %s, line containing %q, hint containing %q", f, tt.want, tt.line, tt.hint)
			}
			if strings.HasPrefix(f.Line, "[") {
				t.Errorf("line keeps its prefix: %q", f.Line)
			}
			if !strings.Contains(f.String(), f.Title) {
				t.Errorf("String() = %q lacks the title", f.String())
			}
		})
	}
}

func TestDetectFailureHealthyLog(t *testing.T) {
	t.Parallel()
	if f, ok := DetectFailure(strings.Split(sampleLog, "\n")); ok {
		t.Errorf("healthy log reported as %+v", f)
	}
	if _, ok := DetectFailure(nil); ok {
		t.Error("no lines reported a failure")
	}
}
