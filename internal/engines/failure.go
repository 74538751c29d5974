package engines

import (
	"regexp"
	"strings"
	"unicode/utf8"
)

// FailureKind names a known way a launch dies, in any engine.
type FailureKind string

// The failures DetectFailure recognises (FailureEngineCrash is vLLM's).
const (
	FailureOOM            FailureKind = "oom"             // out of GPU memory
	FailureCUDAGraph      FailureKind = "cuda-graph"      // CUDA graph capture failed (not for memory)
	FailureBadFlag        FailureKind = "bad-flag"        // argparse rejected the command line
	FailureModelPath      FailureKind = "model-path"      // the checkpoint is not where --model-path (-m, vllm serve MODEL) says
	FailurePortInUse      FailureKind = "port-in-use"     // something else holds the port
	FailureNoGPU          FailureKind = "no-gpu"          // CUDA sees no device
	FailureNCCL           FailureKind = "nccl"            // NCCL could not set up the GPUs' communicator
	FailureSchedulerCrash FailureKind = "scheduler-crash" // any other scheduler exception
	// FailureEngineCrash is vLLM's engine core dying at start-up for a cause the
	// log shows above it (the rules before it name the known causes).
	FailureEngineCrash FailureKind = "engine-crash"
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

// contains matches a message holding any of subs.
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

// vllmRules name vLLM's fatal start-up errors, most specific first, with
// hints in vLLM's flags.
var vllmRules = []rule{
	{FailureOOM, "no GPU memory left for the KV cache",
		"the weights and activations fill --gpu-memory-utilization: raise it if the GPUs have headroom, lower --max-model-len or --max-num-seqs, or add GPUs (--tensor-parallel-size)",
		contains("No available memory for the cache blocks", "larger than the maximum number of tokens that can be stored in KV cache")},
	{FailureOOM, "GPU memory already in use",
		"another process holds GPU memory: stop it, or lower --gpu-memory-utilization to what is free",
		contains("is less than desired GPU memory utilization")},
	{FailureOOM, "out of GPU memory",
		"lower --gpu-memory-utilization (room for activations and CUDA graphs), --max-num-seqs or --max-model-len, use --enforce-eager, or add GPUs (--tensor-parallel-size)",
		contains("CUDA out of memory", "OutOfMemoryError", "CUDA error: out of memory")},
	{FailureModelPath, "model not found",
		"check that the model (vllm serve MODEL or --model) names a directory holding config.json and the weights, or a valid Hugging Face repo id",
		contains("does not appear to have a file named config.json", "Repo id must be in the form", "Invalid repository ID or local directory specified", "Can't load the configuration of")},
	{FailurePortInUse, "port already in use",
		"another process holds the port: stop it (takeover) or choose another --port",
		contains("Address already in use", "address already in use")},
	{FailureNoGPU, "no GPU visible",
		"check CUDA_VISIBLE_DEVICES, the driver (nvidia-smi) and the container's gpu device",
		contains("No CUDA GPUs are available", "no CUDA-capable device is detected", "Failed to infer device type")},
	{FailureEngineCrash, "vLLM's engine core failed to start",
		"the cause is in the traceback above this line in the log",
		contains("Engine core initialization failed", "EngineCore failed to start")},
}

// llamaRules name llama.cpp's (llama-server's) fatal start-up errors.
var llamaRules = []rule{
	{FailureBadFlag, "bad command line",
		"fix or remove the argument llama-server names (llama-server --help lists this build's)",
		contains("error: invalid argument:", "error while handling argument", "error: unknown argument")},
	{FailureOOM, "out of GPU memory",
		"offload fewer layers (-ngl), shrink the context (-c) or the batch (-b/-ub), or use a smaller quantisation",
		contains("cudaMalloc failed: out of memory", "failed to allocate CUDA", "unable to allocate CUDA", "CUDA error: out of memory")},
	{FailurePortInUse, "port already in use",
		"another process holds the port: stop it (takeover) or choose another --port",
		contains("couldn't bind HTTP server socket")},
	{FailureNoGPU, "no GPU visible",
		"check CUDA_VISIBLE_DEVICES, the driver (nvidia-smi) and the container's gpu device",
		contains("ggml_cuda_init: failed to initialize CUDA", "no CUDA-capable device is detected", "invalid value for main_gpu")},
	{FailureModelPath, "model could not be loaded",
		"check that -m names a readable GGUF file; \"unknown model architecture\" means this llama.cpp build is older than the model",
		contains("error loading model", "failed to load model", "exiting due to model loading error")},
}

// DetectFailure looks for a known fatal error in the lines of one launch's
// log and names the most specific one: first by the rules of the dialect the
// log is written in (hints in that engine's flags), then by SGLang's
// (sglang_failure.go: argparse errors, NCCL, SGLang's own), then by the
// other dialects' (a log too short to tell its dialect).
func DetectFailure(lines []string) (Failure, bool) {
	msgs := make([]string, len(lines))
	for i, l := range lines {
		msgs[i] = message(clean(l))
	}
	d := Sniff(lines)
	if f, ok := match(dialectRules[d], msgs); ok {
		return f, true
	}
	if f, ok := sglangFailure(lines); ok {
		return f, true
	}
	for _, other := range []Dialect{VLLM, LlamaCPP} {
		if other != d {
			if f, ok := match(dialectRules[other], msgs); ok {
				return f, true
			}
		}
	}
	return Failure{}, false
}

var dialectRules = map[Dialect][]rule{VLLM: vllmRules, LlamaCPP: llamaRules}

func match(rules []rule, msgs []string) (Failure, bool) {
	for _, r := range rules {
		for i, msg := range msgs {
			if r.match(msg) {
				i = exceptionLine(msgs, i)
				return Failure{Kind: r.kind, Title: r.title, Hint: r.hint, Line: clip(msgs[i], 300), Index: i}, true
			}
		}
	}
	return Failure{}, false
}

// pyFrame is a Python traceback's frame line: `File "/x/y.py", line 329, in NCCL_CHECK`.
var pyFrame = regexp.MustCompile(`^File "[^"]*", line \d+`)

// pyException is the line a Python traceback ends with: the exception's class, dotted
// or not, and its message ("RuntimeError: NCCL error: …", "torch.OutOfMemoryError: …").
var pyException = regexp.MustCompile(`^(?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt)\b(?::.*)?$`)

// exceptionLine is where the quote of a failure found at msgs[i] belongs. A rule may
// match the source line a traceback shows under a frame (`raise RuntimeError(f"NCCL
// error: {error_str}")`): the operator wants the message that was raised, which is the
// traceback's last line, after the remaining frames, their source lines and Python
// 3.11's caret lines. Any other line is its own quote.
func exceptionLine(msgs []string, i int) int {
	if i == 0 || !pyFrame.MatchString(msgs[i-1]) {
		return i
	}
	for j := i + 1; j < len(msgs); j++ {
		switch m := msgs[j]; {
		case pyFrame.MatchString(m), strings.Trim(m, "^~ ") == "" && m != "":
			continue
		case pyFrame.MatchString(msgs[j-1]):
			continue // a frame's source line
		case pyException.MatchString(m):
			return j
		default:
			return i
		}
	}
	return i
}

// message is a line without vLLM's process tag and logger prefix, or
// llama.cpp's one-letter level ("E ").
func message(line string) string {
	if h := vllmHead.FindStringIndex(line); h != nil {
		return strings.TrimSpace(line[h[1]:])
	}
	if i := strings.Index(line, ") "); strings.HasPrefix(line, "(") && i > 0 && strings.Contains(line[:i], " pid=") {
		line = line[i+2:]
	}
	if len(line) > 2 && line[1] == ' ' && strings.ContainsRune("IWEDT", rune(line[0])) {
		line = line[2:]
	}
	return strings.TrimSpace(line)
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
