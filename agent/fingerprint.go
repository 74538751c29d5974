package agent

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
)

// Fingerprint is what one observation of a resource found that its diff was decided
// from, so that a saved plan (agent plan -out) is applied only to the host it saw. The
// engine builds it from the observation itself, never from a second one: the diff's
// action and each change (effect, reason, values, text), the break work left, the
// resource's own state record, and the facts its kind names (Fingerprinter). Every
// value the engine derives is a keyed digest (Options.FingerprintKey), so a fingerprint
// holds no secret in clear; a kind's facts are kept as written, unless sensitive, so
// that a refusal can say how the host changed ("pid: 4711 → 4790").
type Fingerprint struct {
	Action Action `json:"action"`
	// Changes maps each changed attribute to the digest of its change.
	Changes map[string]string `json:"changes,omitempty"`
	// Unfinished is the digest of Diff.Unfinished ("" when none).
	Unfinished string `json:"unfinished,omitempty"`
	// Record is the digest of the resource's state record ("" when it has none).
	Record string `json:"record,omitempty"`
	Orphan bool   `json:"orphan,omitempty"`
	// Facts are the kind's (Fingerprinter), by name.
	Facts map[string]string `json:"facts,omitempty"`
}

// Fact is one thing a kind's decision depends on that its changes do not show.
type Fact struct {
	// Name is how a refusal names it ("pid", "content").
	Name string
	// Value is what the observation found ("4711", "sha256:…").
	Value string
	// Sensitive values (a secret file's content hash) are kept as keyed digests only.
	Sensitive bool
}

// Fingerprinter is implemented by resources whose decision depends on facts of the host
// that their diff's changes do not show: a server's PID and start time, a file's content
// hash, a download's manifest. Facts reads them from d (its Detail) or from the
// resource's own record in env, never from the host again: a fingerprint describes the
// observation a plan was computed from.
type Fingerprinter interface {
	Facts(env *Env, d *Diff) []Fact
}

// Digest is the keyed digest of parts that fingerprints use ("hmac-sha256:…"): for a
// saved plan's other digests (its plan files and variables), made the same way.
func Digest(key []byte, parts ...any) string { return digester(key).of(parts...) }

// digester makes keyed digests: HMAC-SHA256 under the state directory's key, so that a
// saved plan read elsewhere does not let anyone test guesses of a secret against it.
type digester []byte

func (k digester) of(parts ...any) string {
	m := hmac.New(sha256.New, k)
	for _, p := range parts {
		data, err := json.Marshal(p)
		if err != nil {
			data = []byte(fmt.Sprint(p))
		}
		m.Write(data)
		m.Write([]byte{0})
	}
	return "hmac-sha256:" + hex.EncodeToString(m.Sum(nil)[:16])
}

// fingerprint is the fingerprint of addr's observation d.
func (e *Engine) fingerprint(addr string, d *Diff) (Fingerprint, error) {
	k := digester(e.opts.FingerprintKey)
	fp := Fingerprint{Action: d.Action, Orphan: e.isOrphan(addr)}
	for _, c := range d.Changes {
		if fp.Changes == nil {
			fp.Changes = map[string]string{}
		}
		fp.Changes[c.Attr] = k.of(c.EffectOf(), c.Why(), c.HasOld, c.Old, c.HasNew, c.New, c.Text, c.Note)
	}
	if d.Unfinished != "" {
		fp.Unfinished = k.of(d.Unfinished)
	}
	var rec json.RawMessage
	has, err := e.stateFor(addr).Load(&rec)
	if err != nil {
		return fp, withAddr(addr, "fingerprint", err)
	}
	if has {
		fp.Record = k.of(rec)
	}
	if f, ok := e.resources[addr].(Fingerprinter); ok {
		for _, fact := range f.Facts(e.observeEnv(addr), d) {
			if fp.Facts == nil {
				fp.Facts = map[string]string{}
			}
			v := fact.Value
			if fact.Sensitive {
				v = k.of(v)
			}
			fp.Facts[fact.Name] = v
		}
	}
	return fp, nil
}

// Differences says how the observation now (fp, with its diff d) differs from the one
// saved, one phrase per difference, for people; none when they match.
func (saved Fingerprint) Differences(now Fingerprint, d *Diff) []string {
	var out []string
	if saved.Orphan != now.Orphan {
		out = append(out, fmt.Sprintf("orphan: planned %t, now %t", saved.Orphan, now.Orphan))
	}
	if saved.Action != now.Action {
		// Another action: what the observation now finds says it all.
		what := fmt.Sprintf("planned %s, now %s", saved.Action, now.Action)
		if d != nil && len(d.Changes) > 0 {
			var cs []string
			for _, c := range d.Changes {
				cs = append(cs, c.Attr+": "+describeChange(c))
			}
			what += " (" + strings.Join(cs, "; ") + ")"
		}
		out = append(out, what)
	} else {
		out = append(out, changeDifferences(saved.Changes, now.Changes, d)...)
	}
	for _, name := range slices.Sorted(maps.Keys(union(saved.Facts, now.Facts))) {
		was, is := saved.Facts[name], now.Facts[name]
		if was == is {
			continue
		}
		if strings.HasPrefix(was, "hmac-sha256:") || strings.HasPrefix(is, "hmac-sha256:") {
			out = append(out, fmt.Sprintf("%s changed (sensitive: digests differ)", name))
			continue
		}
		out = append(out, fmt.Sprintf("%s: %s → %s", name, orNone(was), orNone(is)))
	}
	if saved.Unfinished != now.Unfinished {
		what := "none"
		if d != nil && d.Unfinished != "" {
			what = d.Unfinished
		}
		out = append(out, "unfinished break work changed (now: "+what+")")
	}
	if saved.Record != now.Record {
		out = append(out, "its state record changed (another apply, destroy or agent run acted on it)")
	}
	return out
}

// changeDifferences compares the changes of two observations of one action, attribute
// by attribute.
func changeDifferences(saved, now map[string]string, d *Diff) []string {
	byAttr := map[string]Change{}
	if d != nil {
		for _, c := range d.Changes {
			byAttr[c.Attr] = c
		}
	}
	var out []string
	for _, a := range slices.Sorted(maps.Keys(union(saved, now))) {
		was, had := saved[a]
		is, has := now[a]
		switch {
		case had && !has:
			out = append(out, a+" no longer changes")
		case !had && has:
			out = append(out, a+" now changes: "+describeChange(byAttr[a]))
		case was != is:
			out = append(out, a+" changes otherwise: "+describeChange(byAttr[a]))
		}
	}
	return out
}

func union(a, b map[string]string) map[string]string {
	m := maps.Clone(a)
	if m == nil {
		m = map[string]string{}
	}
	maps.Copy(m, b)
	return m
}

func orNone(s string) string {
	if s == "" {
		return "(none)"
	}
	return s
}

// describeChange is a change for a refusal: its values unless sensitive, and its effect
// and reason.
func describeChange(c Change) string {
	var vals string
	switch {
	case c.Sensitive:
		vals = "(sensitive)"
	case c.HasOld && c.HasNew:
		vals = Render(c.Old) + " → " + Render(c.New)
	case c.HasNew:
		vals = Render(c.New)
	case c.HasOld:
		vals = Render(c.Old) + " → (removed)"
	}
	return strings.TrimSpace(fmt.Sprintf("%s (%s, %s)", vals, c.EffectOf(), c.Why().Describe()))
}

// StaleError is the refusal of a saved plan whose host or plan no longer matches what
// was observed when it was saved: nothing was applied.
type StaleError struct {
	// Changed maps each address whose observation changed to how, one phrase each.
	Changed map[string][]string
}

func (e *StaleError) Error() string {
	addrs := make([]string, 0, len(e.Changed))
	for a := range e.Changed {
		addrs = append(addrs, a)
	}
	sort.Strings(addrs)
	var b strings.Builder
	fmt.Fprintf(&b, "the host changed since the plan was saved (%d resources); nothing was applied: make a new plan (agent plan -out), review it, and apply that", len(addrs))
	for _, a := range addrs {
		fmt.Fprintf(&b, "\n  %s: %s", a, strings.Join(e.Changed[a], "; "))
	}
	return b.String()
}
