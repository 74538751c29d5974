package lifecycle

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Smoke is one OpenAI-compatible chat completion that a working server must answer.
type Smoke struct {
	Prompt string
	// Sampling is merged into the request body: temperature, top_p, top_k,
	// presence_penalty, …, exactly as declared.
	Sampling  map[string]any
	MaxTokens int
	// Expect, when not empty, must be a substring of the answer.
	Expect string
	// MaxRepetition bounds Repetition(answer); negative means no bound.
	MaxRepetition float64
	// APIKey is sent as a bearer token when not empty.
	APIKey string
	// Timeout bounds the request (DefaultSmokeTimeout when zero).
	Timeout time.Duration
}

// DefaultSmokeTimeout bounds one smoke request.
const DefaultSmokeTimeout = 2 * time.Minute

// SmokeResult is the verdict of one smoke test.
type SmokeResult struct {
	OK bool
	// Reason says why it failed ("answer lacks \"4\"", "repeated n-grams 0.95 > 0.30").
	Reason string
	// Output is the answer, clipped, for the operator to see.
	Output     string
	Repetition float64
	Finish     string
}

// SmokeError is a launch whose server is up and ready but failed its smoke test. The
// server is left running: a bad answer is a sampling problem, not a server fault.
type SmokeError struct {
	Generation int
	Result     SmokeResult
}

func (e *SmokeError) Error() string {
	return fmt.Sprintf("generation %d is running and ready but failed its smoke test: %s; answer: %s (the server was left running: fix the sampling or the expectation)",
		e.Generation, e.Result.Reason, strconv.Quote(e.Result.Output))
}

// RepetitionN is the n-gram length of Repetition.
const RepetitionN = 3

// Repetition is the share of text made of repeated word n-grams: of all its word
// trigrams, the fraction that already occurred earlier. A normal answer scores 0, an
// answer stuck in a loop close to 1.
func Repetition(text string) float64 {
	words := strings.Fields(strings.ToLower(text))
	total := len(words) - RepetitionN + 1
	if total <= 1 {
		return 0
	}
	seen := make(map[string]bool, total)
	repeated := 0
	for i := 0; i < total; i++ {
		g := strings.Join(words[i:i+RepetitionN], " ")
		if seen[g] {
			repeated++
		}
		seen[g] = true
	}
	return float64(repeated) / float64(total)
}

// RunSmoke sends s to the OpenAI API at endpoint (host:port) and judges the answer.
// An error means no verdict (the request failed); a bad answer is a result with OK false.
func RunSmoke(ctx context.Context, client *http.Client, endpoint string, s Smoke) (SmokeResult, error) {
	timeout := s.Timeout
	if timeout <= 0 {
		timeout = DefaultSmokeTimeout
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if client == nil {
		client = http.DefaultClient
	}
	body := map[string]any{}
	maps.Copy(body, s.Sampling)
	if model := servedModel(ctx, client, endpoint, s.APIKey); model != "" {
		body["model"] = model
	}
	body["messages"] = []map[string]string{{"role": "user", "content": s.Prompt}}
	if s.MaxTokens > 0 {
		body["max_tokens"] = s.MaxTokens
	}
	body["stream"] = false
	b, err := json.Marshal(body)
	if err != nil {
		return SmokeResult{}, fmt.Errorf("smoke test: encode request: %w", err)
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+endpoint+"/v1/chat/completions", bytes.NewReader(b))
	if err != nil {
		return SmokeResult{}, fmt.Errorf("smoke test: %w", err)
	}
	req.Header.Set("Content-Type", "application/json")
	if s.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+s.APIKey)
	}
	resp, err := client.Do(req)
	if err != nil {
		return SmokeResult{}, fmt.Errorf("smoke test: %w", err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return SmokeResult{}, fmt.Errorf("smoke test: read answer: %w", err)
	}
	if resp.StatusCode != http.StatusOK {
		return SmokeResult{OK: false, Reason: fmt.Sprintf("HTTP %d", resp.StatusCode), Output: clip(string(raw), 300)}, nil
	}
	var out struct {
		Choices []struct {
			Message struct {
				Content          *string `json:"content"`
				ReasoningContent *string `json:"reasoning_content"`
			} `json:"message"`
			FinishReason *string `json:"finish_reason"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(raw, &out); err != nil || len(out.Choices) == 0 {
		return SmokeResult{OK: false, Reason: "not an OpenAI chat completion", Output: clip(string(raw), 300)}, nil
	}
	c := out.Choices[0]
	var text string
	if c.Message.ReasoningContent != nil {
		text = *c.Message.ReasoningContent + "\n"
	}
	if c.Message.Content != nil {
		text += *c.Message.Content
	}
	r := SmokeResult{OK: true, Output: clip(strings.TrimSpace(text), 300), Repetition: Repetition(text)}
	if c.FinishReason != nil {
		r.Finish = *c.FinishReason
	}
	var reasons []string
	if s.MaxRepetition >= 0 && r.Repetition > s.MaxRepetition {
		reasons = append(reasons, fmt.Sprintf("output loops: repeated %d-grams %.2f > max_repetition %.2f (finish %s)", RepetitionN, r.Repetition, s.MaxRepetition, r.Finish))
	}
	if s.Expect != "" && !strings.Contains(text, s.Expect) {
		reasons = append(reasons, fmt.Sprintf("answer lacks %q", s.Expect))
	}
	if len(reasons) > 0 {
		r.OK = false
		r.Reason = strings.Join(reasons, "; ")
	}
	return r, nil
}

// servedModel asks /v1/models for the model name to put in the request ("" when the
// server does not say).
func servedModel(ctx context.Context, client *http.Client, endpoint, key string) string {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+endpoint+"/v1/models", nil)
	if err != nil {
		return ""
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := client.Do(req)
	if err != nil {
		return ""
	}
	defer resp.Body.Close()
	var m struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if resp.StatusCode != http.StatusOK || json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&m) != nil || len(m.Data) == 0 {
		return ""
	}
	return m.Data[0].ID
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
