package export

import "testing"

// Every entry point of the three engines is recognised, including a console script
// seen through its shebang (the interpreter and the script's path in /proc).
func TestRecognise(t *testing.T) {
	t.Parallel()
	tests := []struct {
		argv    []string
		engine  string
		flagsAt int
		model   string
	}{
		{[]string{"python3", "-m", "sglang.launch_server", "--model-path", "/m"}, EngineSGLang, 3, ""},
		{[]string{"/usr/bin/python3.12", "-u", "-m", "sglang.launch_server", "--port", "1"}, EngineSGLang, 4, ""},
		{[]string{"sglang", "serve", "--model-path", "/m"}, EngineSGLang, 2, ""},
		{[]string{"/usr/local/bin/sglang", "serve", "Qwen/Qwen3-8B", "--port", "30000"}, EngineSGLang, 3, "Qwen/Qwen3-8B"},
		{[]string{"/usr/bin/python3", "/usr/local/bin/sglang", "serve", "--model-path", "/m"}, EngineSGLang, 3, ""},
		{[]string{"/usr/bin/python3", "/opt/venv/bin/vllm", "serve", "/models/q", "--port", "8000"}, EngineVLLM, 4, "/models/q"},
		{[]string{"vllm", "serve", "/models/q"}, EngineVLLM, 3, "/models/q"},
		{[]string{"python3", "-m", "vllm.entrypoints.openai.api_server", "--model", "/m"}, EngineVLLM, 3, ""},
		{[]string{"/opt/llama.cpp/llama-server", "-m", "/m.gguf"}, EngineLlamaCPP, 1, ""},
		{[]string{"fake-sglang", "serve", "--model-path", "/m"}, EngineSGLang, 2, ""},
		{[]string{"fake-sglang", "--model-path", "/m"}, EngineSGLang, 1, ""},
		{[]string{"sglang", "version"}, "", 0, ""},
		{[]string{"/usr/bin/python3", "/usr/local/bin/sglang", "version"}, "", 0, ""},
		{[]string{"python3", "/srv/app.py", "--port", "1"}, "", 0, ""},
		{[]string{"python3", "-m", "sglang.bench_serving"}, "", 0, ""},
	}
	for _, tt := range tests {
		e, at := recognise(tt.argv)
		if e != tt.engine || at != tt.flagsAt {
			t.Errorf("recognise(%q) = %q, %d; want %q, %d", tt.argv, e, at, tt.engine, tt.flagsAt)
			continue
		}
		if e != "" {
			if got := servePositional(tt.argv[:at]); got != tt.model {
				t.Errorf("servePositional(%q) = %q, want %q", tt.argv[:at], got, tt.model)
			}
		}
	}
}
