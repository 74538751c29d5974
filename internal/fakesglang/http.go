package main

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"
)

func (s *server) serveHTTP(ln net.Listener) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /health", s.health)
	mux.HandleFunc("GET /health_generate", s.healthGenerate)
	mux.HandleFunc("GET /v1/models", s.models)
	mux.HandleFunc("GET /get_model_info", s.modelInfo)
	mux.HandleFunc("POST /v1/chat/completions", s.chat)
	mux.HandleFunc("GET /metrics", s.metrics)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusNotFound, map[string]string{"detail": "Not Found"})
	})
	srv := &http.Server{Handler: s.accessLog(mux), ReadHeaderTimeout: 10 * time.Second}
	_ = srv.Serve(ln) // returns when the listener closes at exit
}

type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	w.code = code
	w.ResponseWriter.WriteHeader(code)
}

// accessLog prints uvicorn's access line for every request.
func (s *server) accessLog(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sw := &statusWriter{ResponseWriter: w, code: http.StatusOK}
		h.ServeHTTP(sw, r)
		s.log.main(`INFO:     %s - "%s %s HTTP/%d.%d" %d %s`, r.RemoteAddr, r.Method, r.URL.RequestURI(), r.ProtoMajor, r.ProtoMinor, sw.code, http.StatusText(sw.code))
	})
}

func (s *server) isReady() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ready
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func (s *server) health(w http.ResponseWriter, r *http.Request) {
	if !s.isReady() {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	w.WriteHeader(http.StatusOK)
}

func (s *server) modelName() string { return s.args.str("served-model-name") }

func (s *server) models(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{
		"object": "list",
		"data": []map[string]any{{
			"id": s.modelName(), "object": "model", "created": time.Now().Unix(),
			"owned_by": "sglang", "root": s.modelName(), "max_model_len": 262144,
		}},
	})
}

func (s *server) modelInfo(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, map[string]any{
		"model_path": s.args.str("model-path"), "tokenizer_path": s.args.str("tokenizer-path"),
		"is_generation": true, "weight_version": "default",
	})
}

type chatRequest struct {
	Model    string `json:"model"`
	Messages []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	} `json:"messages"`
	MaxTokens       *int     `json:"max_tokens"`
	PresencePenalty *float64 `json:"presence_penalty"`
	Stream          bool     `json:"stream"`
}

// text returns a message's content, a string or OpenAI's list of parts.
func text(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var parts []struct {
		Text string `json:"text"`
	}
	_ = json.Unmarshal(raw, &parts)
	var b strings.Builder
	for _, p := range parts {
		b.WriteString(p.Text)
	}
	return b.String()
}

// loopSentence is what Qwen3.6 repeated in the field report when sampled
// without a presence penalty.
const loopSentence = "The user is asking for the result of 2+2."

func (s *server) answer(req chatRequest, prompt string) (content, finish string) {
	maxTokens := 512
	if req.MaxTokens != nil && *req.MaxTokens > 0 {
		maxTokens = *req.MaxTokens
	}
	if s.faults.loop && (req.PresencePenalty == nil || *req.PresencePenalty <= 0) {
		words := strings.Fields(loopSentence)
		var out []string
		for len(out)+len(words) <= maxTokens {
			out = append(out, words...)
		}
		if len(out) == 0 {
			out = words[:min(maxTokens, len(words))]
		}
		return strings.Join(out, " "), "length"
	}
	if strings.Contains(strings.ReplaceAll(prompt, " ", ""), "2+2") {
		return "2 + 2 = 4.", "stop"
	}
	return "I am a fake SGLang server; I have no model, but I am serving.", "stop"
}

func (s *server) chat(w http.ResponseWriter, r *http.Request) {
	if !s.isReady() {
		writeJSON(w, http.StatusServiceUnavailable, map[string]string{"detail": "server is not ready"})
		return
	}
	if key := s.args.str("api-key"); key != "" && r.Header.Get("Authorization") != "Bearer "+key {
		writeJSON(w, http.StatusUnauthorized, map[string]string{"error": "Unauthorized"})
		return
	}
	if s.isWedged() {
		s.hang(r, 0)
		return
	}
	var req chatRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, 8<<20))
	if err := dec.Decode(&req); err != nil {
		writeJSON(w, http.StatusBadRequest, map[string]any{"object": "error", "message": fmt.Sprintf("invalid request: %v", err), "type": "BadRequestError", "code": 400})
		return
	}
	if len(req.Messages) == 0 {
		writeJSON(w, http.StatusBadRequest, map[string]any{"object": "error", "message": "messages must not be empty", "type": "BadRequestError", "code": 400})
		return
	}
	var prompt strings.Builder
	for _, m := range req.Messages {
		prompt.WriteString(text(m.Content))
		prompt.WriteString("\n")
	}
	promptTokens := len(strings.Fields(prompt.String())) + 4*len(req.Messages)
	content, finish := s.answer(req, prompt.String())
	completion := len(strings.Fields(content))
	if completion == 0 {
		completion = 1
	}
	s.mu.Lock()
	s.stats.promptTokens += promptTokens
	s.stats.generationTokens += completion
	s.stats.requests++
	s.mu.Unlock()
	s.log.rank(0, "Prefill batch, #new-seq: 1, #new-token: %d, #cached-token: 0, %s#running-req: 0, #queue-req: 0, ", promptTokens, s.usageMsg(false))
	s.decodeLine(completion)

	id := fmt.Sprintf("%x", time.Now().UnixNano())
	usage := map[string]any{"prompt_tokens": promptTokens, "completion_tokens": completion, "total_tokens": promptTokens + completion, "prompt_tokens_details": nil}
	if req.Stream {
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		chunk := func(delta map[string]any, finish any, usage any) {
			b, _ := json.Marshal(map[string]any{
				"id": id, "object": "chat.completion.chunk", "created": time.Now().Unix(), "model": s.modelName(),
				"choices": []map[string]any{{"index": 0, "delta": delta, "logprobs": nil, "finish_reason": finish}},
				"usage":   usage,
			})
			fmt.Fprintf(w, "data: %s\n\n", b)
		}
		chunk(map[string]any{"role": "assistant", "content": content}, nil, nil)
		chunk(map[string]any{}, finish, usage)
		fmt.Fprint(w, "data: [DONE]\n\n")
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"id": id, "object": "chat.completion", "created": time.Now().Unix(), "model": s.modelName(),
		"choices": []map[string]any{{
			"index":         0,
			"message":       map[string]any{"role": "assistant", "content": content, "reasoning_content": nil, "tool_calls": nil},
			"logprobs":      nil,
			"finish_reason": finish,
			"matched_stop":  nil,
		}},
		"usage": usage,
	})
}

// metrics serves SGLang's Prometheus names; without --enable-metrics the
// route does not exist, as in SGLang.
func (s *server) metrics(w http.ResponseWriter, r *http.Request) {
	if !s.args.on("enable-metrics") {
		writeJSON(w, http.StatusNotFound, map[string]string{"detail": "Not Found"})
		return
	}
	s.mu.Lock()
	st, hung := s.stats, s.hung
	s.mu.Unlock()
	// One series per scheduler that exports: the first TP rank of each DP
	// rank, labelled dp_rank with DP attention (as SGLang's metrics mixin).
	var labels []string
	if n := s.dpRanks(); n > 1 {
		for dp := 0; dp < n; dp++ {
			labels = append(labels, fmt.Sprintf(`dp_rank="%d",engine_type="unified",model_name=%q,moe_ep_rank="0",pp_rank="0",tp_rank="%d"`, dp, s.modelName(), dp*s.tpSize()/n))
		}
	} else {
		labels = []string{fmt.Sprintf(`engine_type="unified",model_name=%q,moe_ep_rank="0",pp_rank="0",tp_rank="0"`, s.modelName())}
	}
	var b strings.Builder
	gauge := func(name, help string, v float64) {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s gauge\n", name, help, name)
		for _, l := range labels {
			fmt.Fprintf(&b, "%s{%s} %g\n", name, l, v)
		}
	}
	counter := func(name, help string, v float64) {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s counter\n%s_total{model_name=%q} %g\n", name, help, name, name, s.modelName(), v)
	}
	running := 0.0
	if st.decodeTicks > 0 {
		running = 1
	}
	usage := float64(st.tokens) / 413696
	gauge("sglang:num_running_reqs", "The number of running requests.", running)
	gauge("sglang:num_used_tokens", "The number of used tokens.", float64(st.tokens))
	gauge("sglang:token_usage", "The token usage.", usage)
	if s.hybrid() {
		gauge("sglang:mamba_usage", "The token usage for Mamba layers.", 0.06)
	}
	gauge("sglang:gen_throughput", "The generation throughput (token/s).", s.genThroughput())
	gauge("sglang:num_queue_reqs", "The number of requests in the waiting queue.", float64(hung))
	gauge("sglang:cache_hit_rate", "The prefix cache hit rate.", 0)
	al, ar, _ := s.specNumbers()
	gauge("sglang:spec_accept_length", "The average acceptance length of speculative decoding.", al)
	gauge("sglang:spec_accept_rate", "The average acceptance rate of speculative decoding (`accepted tokens / total draft tokens` in batch).", ar)
	counter("sglang:prompt_tokens", "Number of prefill tokens processed.", float64(st.promptTokens))
	counter("sglang:generation_tokens", "Number of generation tokens processed.", float64(st.generationTokens))
	counter("sglang:num_requests", "The number of requests.", float64(st.requests))
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	fmt.Fprint(w, b.String())
}
