package engines

import (
	"regexp"
	"strings"
)

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

// sglangRules name SGLang's fatal errors; read-only after package
// initialisation.
var sglangRules = []rule{
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

// sglangFailure looks for a known SGLang failure in the lines of one launch's
// log and names the most specific one. ok is false when none is recognised.
func sglangFailure(lines []string) (Failure, bool) {
	msgs := make([]string, len(lines))
	for i, l := range lines {
		_, msg, _ := SplitPrefix(strings.TrimRight(l, "\r\n"), nil)
		// message() also takes off another engine's head: SGLang's errors (NCCL) are
		// raised in vLLM's workers too, and their tracebacks quoted the same way.
		msgs[i] = message(strings.TrimSpace(msg))
	}
	return match(sglangRules, msgs)
}
