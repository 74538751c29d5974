package sglang

import (
	"regexp"
	"strings"
	"unicode/utf8"
)

// FailureKind names a known way an SGLang launch dies.
type FailureKind string

// The failures DetectFailure recognises.
const (
	FailureOOM            FailureKind = "oom"             // out of GPU memory
	FailureCUDAGraph      FailureKind = "cuda-graph"      // CUDA graph capture failed (not for memory)
	FailureBadFlag        FailureKind = "bad-flag"        // argparse rejected the command line
	FailureModelPath      FailureKind = "model-path"      // the checkpoint is not where --model-path says
	FailurePortInUse      FailureKind = "port-in-use"     // something else holds the port
	FailureNoGPU          FailureKind = "no-gpu"          // CUDA sees no device
	FailureNCCL           FailureKind = "nccl"            // NCCL could not set up the GPUs' communicator
	FailureSchedulerCrash FailureKind = "scheduler-crash" // any other scheduler exception
)

// Failure is a recognised failure in a launch's log.
type Failure struct {
	Kind  FailureKind
	Title string // what happened, for the operator: "out of GPU memory"
	Hint  string // what to change
	Line  string // the log line that shows it, prefix removed
	Index int    // its index in the lines given
}

// String renders "out of GPU memory: <line> — <hint>".
func (f Failure) String() string {
	s := f.Title
	if f.Line != "" {
		s += ": " + f.Line
	}
	if f.Hint != "" {
		s += " — " + f.Hint
	}
	return s
}

// rule recognises one failure. Rules are tried in order over all lines, so an
// earlier rule names the root cause when a log shows several symptoms (an
// OOM inside "Capture cuda graph failed" inside "Scheduler hit an exception").
type rule struct {
	kind  FailureKind
	title string
	hint  string
	match func(msg string) bool
}

// argparseError matches argparse's last line, "PROG: error: MSG". PROG is
// "launch_server.py" for `python -m sglang.launch_server` before 2026, and
// "sglang serve" (with a space) since SGLang builds its parser with
// ArgumentParser(prog="sglang serve") for both entry points; "sglang" for the
// CLI's own subcommand parser. The diffusion path raises
// SystemExit("error: unrecognized arguments: …"), which Python prints alone.
var argparseError = regexp.MustCompile(`^(?:[\w./\-]+(?: serve)?: error: \S|(?:SystemExit: )?error: (?:unrecognized arguments|argument |the following arguments are required|ambiguous option))`)

// internalPortBusy matches SGLang's wait_port_available failure for its own
// ports (rpc_port, metrics_port, nccl_port, dist_init_port, …): "ValueError:
// rpc_port at 30235 is not available in 30 seconds. …".
var internalPortBusy = regexp.MustCompile(`\b[a-z_]*port at \d+ is not available`)

func contains(subs ...string) func(string) bool {
	return func(msg string) bool {
		for _, s := range subs {
			if strings.Contains(msg, s) {
				return true
			}
		}
		return false
	}
}

// rules is read-only after package initialisation.
var rules = []rule{
	{
		kind:  FailureBadFlag,
		title: "bad command line",
		hint:  "fix or remove the flag argparse names (check it exists in this SGLang version)",
		match: argparseError.MatchString,
	},
	{
		kind:  FailureOOM,
		title: "out of GPU memory",
		hint:  "the weights leave no room for the KV cache: raise --mem-fraction-static if the GPUs have headroom, lower --context-length or --max-running-requests, or add GPUs (--tp-size)",
		match: contains("Not enough memory. Please try to increase --mem-fraction-static", "Not enough memory"),
	},
	{
		kind:  FailureOOM,
		title: "out of GPU memory",
		hint:  "lower --mem-fraction-static (leaves room for activations and CUDA graphs), reduce --max-running-requests or --cuda-graph-max-bs, or add GPUs (--tp-size)",
		match: contains("CUDA out of memory", "OutOfMemoryError", "CUDA error: out of memory"),
	},
	{
		kind:  FailureCUDAGraph,
		title: "CUDA graph capture failed",
		hint:  "lower --cuda-graph-max-bs or --mem-fraction-static, or run with --disable-cuda-graph (slower)",
		match: contains("Capture cuda graph failed"),
	},
	{
		kind:  FailureModelPath,
		title: "model not found",
		hint:  "check that --model-path names a directory holding config.json and the weights (or a valid Hugging Face repo id)",
		match: contains("Can't load the configuration of", "Repo id must be in the form", "Can't load tokenizer for"),
	},
	{
		kind:  FailurePortInUse,
		title: "an internal SGLang port is in use",
		hint:  "SGLang's own ports (with DP attention --port+233 to --port+238, or the --dist-init-addr port and the 4 after it) are held by another process, often a scheduler of an earlier launch still alive: stop it, or move --port / --dist-init-addr",
		match: internalPortBusy.MatchString,
	},
	{
		kind:  FailurePortInUse,
		title: "port already in use",
		hint:  "another process holds the port: stop it (takeover) or choose another --port",
		match: contains("address already in use", "Address already in use"),
	},
	{
		kind:  FailureNoGPU,
		title: "no GPU visible",
		hint:  "check CUDA_VISIBLE_DEVICES, the driver (nvidia-smi) and the container's gpu device",
		match: contains("No CUDA GPUs are available", "no CUDA-capable device is detected"),
	},
	{
		kind:  FailureNCCL,
		title: "NCCL error",
		hint:  "the GPUs could not set up NCCL: in a container give /dev/shm room (NCCL needs shared memory) and pass every GPU; set NCCL_DEBUG=INFO in env for the cause; NCCL_P2P_DISABLE=1 or --disable-custom-all-reduce works around broken peer-to-peer",
		match: contains("NCCL error: unhandled system error", "NCCL error:", "ncclSystemError", "ncclUnhandledCudaError"),
	},
	{
		kind:  FailureSchedulerCrash,
		title: "scheduler crashed",
		hint:  "read the traceback in the log; the server must be relaunched",
		match: contains("Scheduler hit an exception"),
	},
}

// DetectFailure looks for a known failure in the lines of one launch's log
// and names the most specific one. ok is false when none is recognised.
func DetectFailure(lines []string) (Failure, bool) {
	msgs := make([]string, len(lines))
	for i, l := range lines {
		_, msg, _ := SplitPrefix(strings.TrimRight(l, "\r\n"), nil)
		msgs[i] = strings.TrimSpace(msg)
	}
	for _, r := range rules {
		for i, msg := range msgs {
			if r.match(msg) {
				return Failure{Kind: r.kind, Title: r.title, Hint: r.hint, Line: clip(msg, 300), Index: i}, true
			}
		}
	}
	return Failure{}, false
}

func clip(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
