package serverlog

import (
	"strings"

	"github.com/agent-dev/agent/internal/sglang"
)

// FailureEngineCrash is vLLM's engine core dying at start-up for a cause the
// log shows above it (the rules before it name the known causes).
const FailureEngineCrash sglang.FailureKind = "engine-crash"

type rule struct {
	kind  sglang.FailureKind
	title string
	hint  string
	subs  []string
}

// vllmRules name vLLM's fatal start-up errors, most specific first, with
// hints in vLLM's flags.
var vllmRules = []rule{
	{sglang.FailureOOM, "no GPU memory left for the KV cache",
		"the weights and activations fill --gpu-memory-utilization: raise it if the GPUs have headroom, lower --max-model-len or --max-num-seqs, or add GPUs (--tensor-parallel-size)",
		[]string{"No available memory for the cache blocks", "larger than the maximum number of tokens that can be stored in KV cache"}},
	{sglang.FailureOOM, "GPU memory already in use",
		"another process holds GPU memory: stop it, or lower --gpu-memory-utilization to what is free",
		[]string{"is less than desired GPU memory utilization"}},
	{sglang.FailureOOM, "out of GPU memory",
		"lower --gpu-memory-utilization (room for activations and CUDA graphs), --max-num-seqs or --max-model-len, use --enforce-eager, or add GPUs (--tensor-parallel-size)",
		[]string{"CUDA out of memory", "OutOfMemoryError", "CUDA error: out of memory"}},
	{sglang.FailureModelPath, "model not found",
		"check that the model (vllm serve MODEL or --model) names a directory holding config.json and the weights, or a valid Hugging Face repo id",
		[]string{"does not appear to have a file named config.json", "Repo id must be in the form", "Invalid repository ID or local directory specified", "Can't load the configuration of"}},
	{sglang.FailurePortInUse, "port already in use",
		"another process holds the port: stop it (takeover) or choose another --port",
		[]string{"Address already in use", "address already in use"}},
	{sglang.FailureNoGPU, "no GPU visible",
		"check CUDA_VISIBLE_DEVICES, the driver (nvidia-smi) and the container's gpu device",
		[]string{"No CUDA GPUs are available", "no CUDA-capable device is detected", "Failed to infer device type"}},
	{FailureEngineCrash, "vLLM's engine core failed to start",
		"the cause is in the traceback above this line in the log",
		[]string{"Engine core initialization failed", "EngineCore failed to start"}},
}

// llamaRules name llama.cpp's (llama-server's) fatal start-up errors.
var llamaRules = []rule{
	{sglang.FailureBadFlag, "bad command line",
		"fix or remove the argument llama-server names (llama-server --help lists this build's)",
		[]string{"error: invalid argument:", "error while handling argument", "error: unknown argument"}},
	{sglang.FailureOOM, "out of GPU memory",
		"offload fewer layers (-ngl), shrink the context (-c) or the batch (-b/-ub), or use a smaller quantisation",
		[]string{"cudaMalloc failed: out of memory", "failed to allocate CUDA", "unable to allocate CUDA", "CUDA error: out of memory"}},
	{sglang.FailurePortInUse, "port already in use",
		"another process holds the port: stop it (takeover) or choose another --port",
		[]string{"couldn't bind HTTP server socket"}},
	{sglang.FailureNoGPU, "no GPU visible",
		"check CUDA_VISIBLE_DEVICES, the driver (nvidia-smi) and the container's gpu device",
		[]string{"ggml_cuda_init: failed to initialize CUDA", "no CUDA-capable device is detected", "invalid value for main_gpu"}},
	{sglang.FailureModelPath, "model could not be loaded",
		"check that -m names a readable GGUF file; \"unknown model architecture\" means this llama.cpp build is older than the model",
		[]string{"error loading model", "failed to load model", "exiting due to model loading error"}},
}

// DetectFailure looks for a known fatal error in the lines of one launch's
// log and names the most specific one: first by the rules of the dialect the
// log is written in (hints in that engine's flags), then by SGLang's
// (sglang.DetectFailure: argparse errors, NCCL, SGLang's own), then by the
// other dialects' (a log too short to tell its dialect).
func DetectFailure(lines []string) (sglang.Failure, bool) {
	msgs := make([]string, len(lines))
	for i, l := range lines {
		msgs[i] = message(clean(l))
	}
	d := Sniff(lines)
	if f, ok := match(dialectRules[d], msgs); ok {
		return f, true
	}
	if f, ok := sglang.DetectFailure(lines); ok {
		return f, true
	}
	for _, other := range []Dialect{VLLM, LlamaCPP} {
		if other != d {
			if f, ok := match(dialectRules[other], msgs); ok {
				return f, true
			}
		}
	}
	return sglang.Failure{}, false
}

var dialectRules = map[Dialect][]rule{VLLM: vllmRules, LlamaCPP: llamaRules}

func match(rules []rule, msgs []string) (sglang.Failure, bool) {
	for _, r := range rules {
		for i, msg := range msgs {
			for _, sub := range r.subs {
				if strings.Contains(msg, sub) {
					return sglang.Failure{Kind: r.kind, Title: r.title, Hint: r.hint, Line: clip(msg, 300), Index: i}, true
				}
			}
		}
	}
	return sglang.Failure{}, false
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
	for n > 0 && (s[n]&0xC0) == 0x80 {
		n--
	}
	return s[:n] + "…"
}
