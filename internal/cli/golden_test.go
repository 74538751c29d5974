package cli

import (
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"

	"github.com/rogpeppe/go-internal/testscript"
)

// The golden scripts (testdata/script/golden_*.txtar) compare whole outputs with files in
// the script: `normalize stdout got` writes the last command's stdout (or stderr) to got
// with what differs from run to run replaced, then `cmp got NAME.golden` compares it.
// go test ./internal/cli -run TestScripts -update rewrites the golden files in the
// scripts (testscript's UpdateScripts).
//
// What is replaced, and only in these shapes, so that a real change still shows:
//   - the script's paths and port: $FAKE_SGLANG_BIN, $WORK, $PORT and
//     $PORT2 (as the words they are);
//   - this host's name, quoted ("kpro5") → "HOSTNAME" (the host guard's refusal);
//   - process ids after "pid", "PID", "process", "kill" or "kill -HUP", and the client port of a loopback access-log
//     line (127.0.0.1:51000 - "GET /health …");
//   - wall-clock times (2026-12-02 15:08:22, RFC 3339) → TIME;
//   - measured durations: in parentheses at the end of a step's line ("(3.131s)"), ages
//     ("5m8s ago"), a start's phases and total ("start: weights  1s") → DUR, and how
//     long after its start a launch exited ("0.4 s after start") → "DUR after start".
var (
	pidRE      = regexp.MustCompile(`\b(pid|PID|process|kill|kill -HUP)(\s+)\d+\b`)
	exitedRE   = regexp.MustCompile(`\b\d+\.\d s after (start|it answered ready)\b`)
	clientRE   = regexp.MustCompile(`\b127\.0\.0\.1:\d+ - "`)
	timeRE     = regexp.MustCompile(`\b\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(\.\d+)?(Z|[+-]\d{2}:\d{2})?`)
	durationRE = `(\d+(\.\d+)?(ns|µs|us|ms|s|m|h))+`
	stepDurRE  = regexp.MustCompile(`\(` + durationRE + `\)$`)
	agoRE      = regexp.MustCompile(`\b` + durationRE + ` ago\b`)
	// phaseRE is a start phase's measured time in a status ("start: weights  1s").
	phaseRE = regexp.MustCompile(`(start: [A-Za-z ]+?\s+)` + durationRE + `$`)
)

// normalize is the normalizer of the golden scripts, one for all of them.
func normalize(getenv func(string) string, text string) string {
	vars := []string{"FAKE_SGLANG_BIN", "WORK"}
	sort.SliceStable(vars, func(i, j int) bool { return len(getenv(vars[i])) > len(getenv(vars[j])) })
	for _, v := range vars {
		if val := getenv(v); val != "" {
			text = strings.ReplaceAll(text, val, "$"+v)
		}
	}
	for _, v := range []string{"PORT", "PORT2"} {
		if port := getenv(v); port != "" {
			text = regexp.MustCompile(`\b`+port+`\b`).ReplaceAllString(text, "$$"+v)
		}
	}
	if host := getenv("HOSTNAME"); host != "" {
		text = strings.ReplaceAll(text, `"`+host+`"`, `"HOSTNAME"`)
	}
	text = pidRE.ReplaceAllString(text, "${1}${2}PID")
	text = exitedRE.ReplaceAllString(text, "DUR after ${1}")
	text = clientRE.ReplaceAllString(text, `127.0.0.1:CLIENT - "`)
	text = timeRE.ReplaceAllString(text, "TIME")
	lines := strings.Split(text, "\n")
	for i, l := range lines {
		l = stepDurRE.ReplaceAllString(l, "(DUR)")
		l = phaseRE.ReplaceAllString(l, "${1}DUR")
		lines[i] = agoRE.ReplaceAllString(l, "DUR ago")
	}
	return strings.Join(lines, "\n")
}

// What a --json document has besides: measured step times ("duration_ms": 12 → "DUR"),
// and process ids as status field values ({"key": "pid", …, "value": 4242, "text":
// "4242"} → "PID"), which the text rules above do not see; a quoted host name and an
// access-log line's quote are escaped in JSON strings.
var (
	durationMSRE = regexp.MustCompile(`"duration_ms": \d+`)
	phaseJSONRE  = regexp.MustCompile(`("key": "start_(?:[a-z_]+_)?seconds",\s*"name": "[^"]*",\s*"value": )[\d.e+-]+(,\s*"text": ")[^"]*"`)
	// A start's measured times as numbers: the start_seconds metric, and the
	// start_phase_seconds series.
	startMetricRE = regexp.MustCompile(`("start_seconds": )[\d.e+-]+`)
	phaseSeriesRE = regexp.MustCompile(`("name": "start_phase_seconds",\s*"labels": \{[^}]*\},\s*"value": )[\d.e+-]+`)
	pidFieldRE    = regexp.MustCompile(`("key": "(?:pid|[a-z_]+_pid)",\s*"name": "[^"]*",\s*"value": )\d+(,\s*"text": ")\d+`)
	clientJSONRE  = regexp.MustCompile(`\b127\.0\.0\.1:\d+ - \\"`)
)

// normalizeJSON is normalize for a --json document: the same replacements, and those of
// the document's own shapes. It keeps the document's field order.
func normalizeJSON(getenv func(string) string, doc string) string {
	if host := getenv("HOSTNAME"); host != "" {
		doc = strings.ReplaceAll(doc, `\"`+host+`\"`, `\"HOSTNAME\"`)
	}
	doc = durationMSRE.ReplaceAllString(doc, `"duration_ms": "DUR"`)
	doc = phaseJSONRE.ReplaceAllString(doc, `${1}"DUR"${2}DUR"`)
	doc = startMetricRE.ReplaceAllString(doc, `${1}"DUR"`)
	doc = phaseSeriesRE.ReplaceAllString(doc, `${1}"DUR"`)
	doc = pidFieldRE.ReplaceAllString(doc, `${1}"PID"${2}PID`)
	doc = clientJSONRE.ReplaceAllString(doc, `127.0.0.1:CLIENT - \"`)
	return normalize(getenv, doc)
}

// normalizeCmd is `normalize stdout|stderr FILE`.
func normalizeCmd(ts *testscript.TestScript, neg bool, args []string) {
	if neg || len(args) != 2 || (args[0] != "stdout" && args[0] != "stderr") {
		ts.Fatalf("usage: normalize stdout|stderr FILE")
	}
	getenv := func(k string) string {
		if k == "HOSTNAME" {
			h, _ := os.Hostname()
			return h
		}
		return ts.Getenv(k)
	}
	text := normalize(getenv, ts.ReadFile(args[0]))
	if err := os.WriteFile(ts.MkAbs(args[1]), []byte(text), 0o644); err != nil {
		ts.Fatalf("normalize: %v", err)
	}
}

// The normalizer replaces what varies from run to run and nothing else: a changed
// duration in a plan, a number, a flag value or a path outside the script still shows.
func TestNormalize(t *testing.T) {
	t.Parallel()
	env := map[string]string{"WORK": "/tmp/ts-123", "FAKE_SGLANG_BIN": "/tmp/agent-testbin-9/fake-sglang", "PORT": "41871", "HOSTNAME": "vm"}
	in := `  ✓ server.qwen: created and verified (3.131s)
      pid          5929
      started      2026-12-02 20:16:28 (5m8s ago)
      log          /tmp/ts-123/logs/qwen.1.log
      argv         /tmp/agent-testbin-9/fake-sglang --port 41871 --mem-fraction-static 0.85
      held by      "agent run plan.hcl" (PID 77, since 2026-12-02T20:16:28Z)
      ~ ready.timeout: "15s" → "20s"  (restart)
      ~ flags["port"]: 418710 → 41871
      size         418712 bytes, 12ms
this plan is for host "kpro6" and this is "vm"; vm is unchanged
[2026-12-02 20:22:33] INFO:     127.0.0.1:32880 - "GET /health HTTP/1.1" 200 OK
`
	want := `  ✓ server.qwen: created and verified (DUR)
      pid          PID
      started      TIME (DUR ago)
      log          $WORK/logs/qwen.1.log
      argv         $FAKE_SGLANG_BIN --port $PORT --mem-fraction-static 0.85
      held by      "agent run plan.hcl" (PID PID, since TIME)
      ~ ready.timeout: "15s" → "20s"  (restart)
      ~ flags["port"]: 418710 → $PORT
      size         418712 bytes, 12ms
this plan is for host "kpro6" and this is "HOSTNAME"; vm is unchanged
[TIME] INFO:     127.0.0.1:CLIENT - "GET /health HTTP/1.1" 200 OK
`
	if got := normalize(func(k string) string { return env[k] }, in); got != want {
		t.Errorf("normalize:\n%s\nwant:\n%s", got, want)
	}
}
