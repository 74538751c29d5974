package engines

import (
	"strconv"
	"strings"
	"time"
)

// SGLangReadyLine is the line SGLang prints once its warm-up request succeeded.
const SGLangReadyLine = "The server is fired up and ready to roll!"

// TimeLayout is the layout of the timestamp in SGLang's log prefix
// "[2026-05-01 12:00:00 TP0] ". The time is local to the server, without zone.
const TimeLayout = "2006-01-02 15:04:05"

// clockLayout is the prefix of SGLang releases of 2024, a time without a date:
// "[04:40:55 TP0] Decode batch. …".
const clockLayout = "15:04:05"

// Prefix is the bracketed head of an SGLang log line.
type Prefix struct {
	// Time is when the line was logged, in the location the caller gave.
	Time time.Time
	// Rank names the process that logged it ("TP0", "DP1 TP0", "PP1 TP3",
	// "TP0 EP0"); empty for the main (HTTP/tokenizer) process.
	Rank string
	// Dateless is true for the 2024 form "[04:40:55 TP0]": Time is then the
	// latest moment with that clock time not after now (a line is read while
	// or soon after it is written), so an old log read on a later day is
	// placed on the wrong date.
	Dateless bool
}

// RankNumber returns the number of one rank kind ("DP", "TP", "PP", "EP",
// "ATTN_CP", "MOE_DP") in the prefix, and whether it is there.
func (p Prefix) RankNumber(kind string) (int, bool) {
	return rankNumber(p.Rank, kind)
}

func rankNumber(rank, kind string) (int, bool) {
	for _, f := range strings.Fields(rank) {
		if rest, ok := strings.CutPrefix(f, kind); ok {
			if n, err := strconv.Atoi(rest); err == nil && n >= 0 {
				return n, true
			}
		}
	}
	return 0, false
}

// SplitPrefix splits "[2026-05-01 12:00:00 TP0] message" into its prefix and
// message, reading the time in loc (time.Local when nil). It also accepts the
// milliseconds SGLANG_LOG_MS adds ("12:00:00.123") and the dateless prefix of
// 2024 ("[04:40:55 TP0]"). ok is false when the line has no such prefix
// (tqdm progress bars, traceback lines, argparse); the message is then the
// whole line.
func SplitPrefix(line string, loc *time.Location) (p Prefix, msg string, ok bool) {
	return splitPrefixAt(line, loc, time.Now())
}

func splitPrefixAt(line string, loc *time.Location, now time.Time) (p Prefix, msg string, ok bool) {
	if loc == nil {
		loc = time.Local
	}
	if len(line) < len(clockLayout)+2 || line[0] != '[' {
		return Prefix{}, line, false
	}
	end := strings.IndexByte(line, ']')
	if end < 0 {
		return Prefix{}, line, false
	}
	head := line[1:end]
	var t time.Time
	var rest string
	switch {
	case len(head) >= len(TimeLayout) && head[4] == '-':
		parsed, err := time.ParseInLocation(TimeLayout, head[:len(TimeLayout)], loc)
		if err != nil {
			return Prefix{}, line, false
		}
		t, rest = parsed, head[len(TimeLayout):]
	case len(head) >= len(clockLayout) && head[2] == ':':
		parsed, err := time.ParseInLocation(clockLayout, head[:len(clockLayout)], loc)
		if err != nil {
			return Prefix{}, line, false
		}
		now = now.In(loc)
		t = time.Date(now.Year(), now.Month(), now.Day(), parsed.Hour(), parsed.Minute(), parsed.Second(), 0, loc)
		if t.After(now.Add(time.Minute)) {
			t = t.AddDate(0, 0, -1)
		}
		p.Dateless = true
		rest = head[len(clockLayout):]
	default:
		return Prefix{}, line, false
	}
	if ms, ok := millis(rest); ok {
		t = t.Add(time.Duration(ms) * time.Millisecond)
		rest = rest[4:]
	}
	if rest != "" && rest[0] != ' ' {
		return Prefix{}, line, false
	}
	msg = line[end+1:]
	msg = strings.TrimPrefix(msg, " ")
	p.Time, p.Rank = t, strings.TrimSpace(rest)
	return p, msg, true
}

// millis reads the ".123" SGLANG_LOG_MS puts after the seconds.
func millis(s string) (int, bool) {
	if len(s) < 4 || s[0] != '.' {
		return 0, false
	}
	n := 0
	for _, c := range s[1:4] {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	return n, true
}

// Kind says which scheduler line an Event came from.
type Kind int

// The kinds of scheduler lines.
const (
	KindPrefill Kind = iota + 1
	KindDecode
)

// String returns "prefill" or "decode".
func (k Kind) String() string {
	switch k {
	case KindPrefill:
		return "prefill"
	case KindDecode:
		return "decode"
	}
	return "unknown"
}

// Event is one parsed "Prefill batch" or "Decode batch" line. A nil field was
// absent from the line.
type Event struct {
	// Time is from the line's prefix; zero when the line had none.
	Time time.Time
	Rank string
	Kind Kind
	// Iter is the forward iteration ("Decode batch [123], ..."), printed
	// when SGLANG_LOG_FORWARD_ITERS is set.
	Iter *int

	RunningReqs *int // #running-req
	QueueReqs   *int // #queue-req

	Tokens     *int     // #token (plain attention models)
	TokenUsage *float64 // token usage, share of the KV cache pool

	// Hybrid models (GDN/mamba, sliding window) report per-pool figures.
	FullTokens     *int     // #full token
	FullTokenUsage *float64 // full token usage
	SWATokens      *int     // #swa token
	SWATokenUsage  *float64 // swa token usage
	MambaNum       *int     // mamba num
	MambaUsage     *float64 // mamba usage

	// Speculative decoding (decode lines only, when enabled).
	AcceptLen  *float64 // accept len: tokens accepted per verify step
	AcceptRate *float64 // accept rate: accepted / drafted

	CUDAGraph       *bool    // cuda graph (or cpu, npu, musa graph): this batch ran as a captured graph
	GenThroughput   *float64 // gen throughput (token/s)
	InputThroughput *float64 // input throughput (token/s), prefill

	// Prefill only.
	NewSeqs      *int // #new-seq
	NewTokens    *int // #new-token
	CachedTokens *int // #cached-token
}

// ParseLine parses a Prefill/Decode batch line, reading its time as local
// time. ok is false for every other line.
func ParseLine(line string) (Event, bool) {
	return ParseLineIn(line, time.Local)
}

// ParseLineIn is ParseLine with the prefix time read in loc.
func ParseLineIn(line string, loc *time.Location) (Event, bool) {
	line = strings.TrimRight(line, "\r\n")
	p, msg, _ := SplitPrefix(line, loc)
	var ev Event
	switch {
	case strings.HasPrefix(msg, "Decode batch"):
		ev.Kind = KindDecode
		msg = msg[len("Decode batch"):]
	case strings.HasPrefix(msg, "Prefill batch"):
		ev.Kind = KindPrefill
		msg = msg[len("Prefill batch"):]
	default:
		return Event{}, false
	}
	ev.Time, ev.Rank = p.Time, p.Rank
	// Optional " [iter]" then the "." (old) or "," (new) separator.
	if strings.HasPrefix(msg, " [") {
		end := strings.IndexByte(msg, ']')
		if end < 0 {
			return Event{}, false
		}
		if n, err := strconv.Atoi(msg[2:end]); err == nil {
			ev.Iter = &n
		}
		msg = msg[end+1:]
	}
	if msg == "" || (msg[0] != '.' && msg[0] != ',') {
		return Event{}, false
	}
	fields := 0
	for _, part := range strings.Split(msg[1:], ",") {
		key, val, found := strings.Cut(strings.TrimSpace(part), ": ")
		if !found {
			continue
		}
		if ev.set(strings.TrimSpace(key), strings.TrimSpace(val)) {
			fields++
		}
	}
	if fields == 0 {
		return Event{}, false
	}
	return ev, true
}

// set stores one "key: value" pair and reports whether the key was known and
// its value well-formed.
func (ev *Event) set(key, val string) bool {
	switch key {
	case "#running-req":
		return setInt(&ev.RunningReqs, val)
	case "#queue-req":
		return setInt(&ev.QueueReqs, val)
	case "#token":
		return setInt(&ev.Tokens, val)
	case "token usage":
		return setFloat(&ev.TokenUsage, val)
	case "#full token":
		return setInt(&ev.FullTokens, val)
	case "full token usage":
		return setFloat(&ev.FullTokenUsage, val)
	case "#swa token":
		return setInt(&ev.SWATokens, val)
	case "swa token usage":
		return setFloat(&ev.SWATokenUsage, val)
	case "mamba num":
		return setInt(&ev.MambaNum, val)
	case "mamba usage":
		return setFloat(&ev.MambaUsage, val)
	case "accept len":
		return setFloat(&ev.AcceptLen, val)
	case "accept rate":
		return setFloat(&ev.AcceptRate, val)
	case "cuda graph", "cpu graph", "npu graph", "musa graph":
		// The label names the device's graph runner (CUDA, CPU, Ascend NPU,
		// Moore Threads MUSA); the meaning is the same.
		b, err := strconv.ParseBool(val)
		if err != nil {
			return false
		}
		ev.CUDAGraph = &b
		return true
	case "gen throughput (token/s)":
		return setFloat(&ev.GenThroughput, val)
	case "input throughput (token/s)":
		return setFloat(&ev.InputThroughput, val)
	case "#new-seq":
		return setInt(&ev.NewSeqs, val)
	case "#new-token":
		return setInt(&ev.NewTokens, val)
	case "#cached-token":
		return setInt(&ev.CachedTokens, val)
	}
	return false
}

func setInt(dst **int, val string) bool {
	n, err := strconv.Atoi(val)
	if err != nil {
		return false
	}
	*dst = &n
	return true
}

func setFloat(dst **float64, val string) bool {
	f, err := strconv.ParseFloat(val, 64)
	if err != nil {
		return false
	}
	*dst = &f
	return true
}
