package agent

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/hashicorp/hcl/v2"

	"github.com/agent-dev/agent/internal/state"
	"github.com/agent-dev/agent/plans"
)

var testKey = []byte("0123456789abcdef0123456789abcdef")

// planned is what agent plan -out keeps of a plan run: the fingerprints, by address.
func planned(t *testing.T, e *Engine) map[string]Fingerprint {
	t.Helper()
	rep := e.Plan(context.Background())
	out := map[string]Fingerprint{}
	for _, st := range rep.Steps {
		if st.Err != nil {
			t.Fatalf("%s: %v", st.Addr, st.Err)
		}
		if st.Fingerprint == nil {
			t.Fatalf("%s: no fingerprint", st.Addr)
		}
		out[st.Addr] = *st.Fingerprint
	}
	return out
}

func records(t *testing.T, store *state.Store) map[string]string {
	t.Helper()
	addrs, err := store.List()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, a := range addrs {
		var v string
		if _, err := store.Load(a, &v); err != nil {
			t.Fatal(err)
		}
		out[a] = v
	}
	return out
}

// A saved plan whose host did not change applies exactly its changes, verified; the same
// fingerprints no longer match afterwards (the host is what the plan made it).
func TestSavedPlanAppliesWhenNothingChanged(t *testing.T) {
	t.Parallel()
	store, _ := state.Open(t.TempDir())
	log := &deleteLog{}
	opts := Options{FingerprintKey: testKey}
	want := planned(t, recEngine(t, store, log, recChain, opts))
	rep, err := recEngine(t, store, log, recChain, opts).ApplySaved(context.Background(), want, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	mustApply(t, rep)
	if got := records(t, store); got["rec.a"] != "1" || got["rec.b"] != "1-2" || got["rec.c"] != "3" {
		t.Fatalf("records after the saved apply: %v", got)
	}
	_, err = recEngine(t, store, log, recChain, opts).ApplySaved(context.Background(), want, nil, nil)
	var stale *StaleError
	if !errors.As(err, &stale) || len(stale.Changed) != 3 {
		t.Fatalf("the same saved plan again: %v, want every resource named as changed", err)
	}
	if got := strings.Join(stale.Changed["rec.a"], "; "); !strings.Contains(got, "planned create, now no-op") {
		t.Errorf("rec.a: %q, want the action it was planned with and the one it has now", got)
	}
}

// A host changed after the plan (a record edited, as a file edited by hand) is refused,
// naming the resource and how, and nothing is written: not even the resources that did
// not change.
func TestSavedPlanRefusedWhenTheHostChanged(t *testing.T) {
	t.Parallel()
	store, _ := state.Open(t.TempDir())
	log := &deleteLog{}
	opts := Options{FingerprintKey: testKey}
	if err := store.Save("rec.a", "0"); err != nil {
		t.Fatal(err)
	}
	want := planned(t, recEngine(t, store, log, recChain, opts))
	if err := store.Save("rec.a", "by hand"); err != nil {
		t.Fatal(err)
	}
	rep, err := recEngine(t, store, log, recChain, opts).ApplySaved(context.Background(), want, nil, nil)
	var stale *StaleError
	if !errors.As(err, &stale) || rep != nil {
		t.Fatalf("got %v, %v; want a StaleError and no report", rep, err)
	}
	if !errors.Is(err, ErrStale) {
		t.Error("a StaleError is not ErrStale")
	}
	got := strings.Join(stale.Changed["rec.a"], "; ")
	if len(stale.Changed) != 1 || !strings.Contains(got, `value changes otherwise: "by hand" → "1"`) || !strings.Contains(got, "state record changed") {
		t.Fatalf("changed: %v; want rec.a only, with its value as it is now", stale.Changed)
	}
	if recs := records(t, store); len(recs) != 1 || recs["rec.a"] != "by hand" {
		t.Fatalf("records after the refusal: %v, want only the hand-edited one", recs)
	}
}

// The host may change during the apply: each step vets its own observation right before
// it acts, and one that changed is refused with nothing written for it (its dependents
// are skipped), while what was done before stays done.
func TestSavedPlanStepRefusedWhenItChangedDuringTheApply(t *testing.T) {
	t.Parallel()
	store, _ := state.Open(t.TempDir())
	log := &deleteLog{}
	src := `
rec "a" { value = "1" }
rec "b" {
  value      = "2"
  depends_on = [rec.a]
}
rec "c" {
  value      = "3"
  depends_on = [rec.b]
}
`
	want := planned(t, recEngine(t, store, log, src, Options{FingerprintKey: testKey}))
	hold := func(addr string) error {
		if addr == "rec.b" {
			if has, _ := store.Has("rec.b"); !has {
				return store.Save("rec.b", "meanwhile")
			}
		}
		return nil
	}
	rep, err := recEngine(t, store, log, src, Options{FingerprintKey: testKey, Hold: hold}).ApplySaved(context.Background(), want, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := outcome(rep)
	if got["rec.a"] != "applied:create" || got["rec.b"] != "error" || got["rec.c"] != "skipped:rec.b" {
		t.Fatalf("outcome %v", got)
	}
	for _, st := range rep.Steps {
		if st.Addr == "rec.b" && (!errors.Is(st.Err, ErrStale) || !strings.Contains(st.Err.Error(), "planned create, now update")) {
			t.Errorf("rec.b: %v, want the saved plan's refusal", st.Err)
		}
	}
	if recs := records(t, store); recs["rec.b"] != "meanwhile" {
		t.Errorf("rec.b's record is %q; the refused step wrote it", recs["rec.b"])
	}
}

// A plan whose only change is a delete (an orphan) is saved and applied like any other.
func TestSavedPlanDeletesAnOrphan(t *testing.T) {
	t.Parallel()
	store, _ := state.Open(t.TempDir())
	log := &deleteLog{}
	mustApply(t, recEngine(t, store, log, recChain, Options{}).Apply(context.Background(), nil))
	kept := `
rec "a" { value = "1" }
rec "b" { value = "${rec.a.value}-2" }
`
	opts := Options{FingerprintKey: testKey, Orphans: OrphansDelete}
	want := planned(t, recEngine(t, store, log, kept, opts))
	if fp := want["rec.c"]; fp.Action != Delete || !fp.Orphan {
		t.Fatalf("rec.c planned %+v, want an orphan's delete", fp)
	}
	rep, err := recEngine(t, store, log, kept, opts).ApplySaved(context.Background(), want, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	mustApply(t, rep)
	if got := outcome(rep); got["rec.c"] != "applied:delete" || got["rec.a"] != "no-op" {
		t.Fatalf("outcome %v", got)
	}
}

// secretRes names a sensitive fact (a secret file's content hash) and a plain one.
type secretRes struct{ recRes }

func (s *secretRes) Facts(env *Env, d *Diff) []Fact {
	return []Fact{{Name: "content", Value: "sha256:" + s.value, Sensitive: true}, {Name: "pid", Value: "4711"}}
}

// A fingerprint holds no secret in clear: a sensitive change's values and a sensitive
// fact are keyed digests, while a plain fact stays readable for the refusal.
func TestFingerprintHoldsNoSecret(t *testing.T) {
	t.Parallel()
	store, _ := state.Open(t.TempDir())
	const secret = "hf_planted_secret_value"
	k := NewKind("sec", func(r *plans.Resource, c *recConfig) (Resource, hcl.Diagnostics) {
		return &secretRes{recRes{addr: r.Addr, value: c.Value}}, nil
	})
	p, diags := plans.LoadSources(".", []plans.Source{{Name: "plan.hcl", Data: []byte(`sec "t" { value = "` + secret + `" }`)}}, plans.Options{Schemas: Schemas([]Kind{k})})
	if diags.HasErrors() {
		t.Fatal(diags.Error())
	}
	e, err := New(p, []Kind{k}, store, Options{FingerprintKey: testKey})
	if err != nil {
		t.Fatal(err)
	}
	fp := planned(t, e)["sec.t"]
	text := strings.Join([]string{fp.Changes["value"], fp.Facts["content"], fp.Facts["pid"]}, " ")
	if strings.Contains(text, secret) || !strings.HasPrefix(fp.Facts["content"], "hmac-sha256:") || fp.Facts["pid"] != "4711" {
		t.Fatalf("fingerprint %+v: want the secret only as a digest and the pid as is", fp)
	}
	other := fp
	other.Facts = map[string]string{"content": "hmac-sha256:00", "pid": "4790"}
	got := strings.Join(fp.Differences(other, nil), "; ")
	if got != "content changed (sensitive: digests differ); pid: 4711 → 4790" {
		t.Errorf("differences: %q", got)
	}
	if digester([]byte("another key")).of(secret) == digester(testKey).of(secret) {
		t.Error("digests do not depend on the key")
	}
}

// mirror observes another resource's record (src): its value is src's plus "!", and a
// change becomes a restart when src's value is restart_on. What it plans depends on what
// an apply did to src.
type mirrorConfig struct {
	Src       string `hcl:"src"`
	RestartOn string `hcl:"restart_on,optional"`
}

type mirror struct{ cfg *mirrorConfig }

func (m *mirror) want(env *Env) (string, string, error) {
	var src string
	if _, err := env.State.Others().Load(m.cfg.Src, &src); err != nil {
		return "", "", err
	}
	return src + "!", src, nil
}

func (m *mirror) Check(ctx context.Context, env *Env) (*Diff, error) {
	want, src, err := m.want(env)
	if err != nil {
		return nil, err
	}
	var have string
	if _, err := env.State.Load(&have); err != nil || have == want {
		return NoChange(), err
	}
	c := Set("value", have, want)
	if m.cfg.RestartOn != "" && src == m.cfg.RestartOn {
		c = c.Because(Restarts, ReasonIdentity)
	}
	return (&Diff{}).Add(c), nil
}

func (m *mirror) Apply(ctx context.Context, env *Env, d *Diff) error {
	want, _, err := m.want(env)
	if err != nil {
		return err
	}
	return env.State.Save(want)
}

// A resource that depends on one the saved plan changes is observed after that change:
// its changes may then differ from the saved ones (they compare with the new state), its
// action may not.
func TestSavedPlanDependentsKeepTheirAction(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, restartOn, want string
	}{
		{"same action, other values", "", "applied:update"},
		{"a restart it was not planned with", "1", "error"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store, _ := state.Open(t.TempDir())
			if err := store.Save("mirror.b", "old!"); err != nil {
				t.Fatal(err)
			}
			k := append(recKinds(&deleteLog{}), NewKind("mirror", func(r *plans.Resource, c *mirrorConfig) (Resource, hcl.Diagnostics) {
				return &mirror{cfg: c}, nil
			}))
			src := `
rec "a" { value = "1" }
mirror "b" {
  src        = "rec.a"
  restart_on = "` + tc.restartOn + `"
  depends_on = [rec.a]
}
`
			eng := func() *Engine {
				p, diags := plans.LoadSources(".", []plans.Source{{Name: "plan.hcl", Data: []byte(src)}}, plans.Options{Schemas: Schemas(k)})
				if diags.HasErrors() {
					t.Fatal(diags.Error())
				}
				e, err := New(p, k, store, Options{FingerprintKey: testKey})
				if err != nil {
					t.Fatal(err)
				}
				return e
			}
			want := planned(t, eng())
			if want["mirror.b"].Action != Update {
				t.Fatalf("mirror.b planned %s, want update", want["mirror.b"].Action)
			}
			rep, err := eng().ApplySaved(context.Background(), want, nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			got := outcome(rep)
			if got["rec.a"] != "applied:create" || got["mirror.b"] != tc.want {
				t.Fatalf("outcome %v, want mirror.b %s", got, tc.want)
			}
			if tc.want == "error" {
				if recs := records(t, store); recs["mirror.b"] != "old!" {
					t.Errorf("mirror.b's record is %q: the refused step wrote it", recs["mirror.b"])
				}
				for _, st := range rep.Steps {
					if st.Addr == "mirror.b" && !strings.Contains(fmt.Sprint(st.Err), "after the changes it depends on, planned update, now restart") {
						t.Errorf("mirror.b: %v", st.Err)
					}
				}
			}
		})
	}
}
