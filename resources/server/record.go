package server

import (
	"crypto/sha256"
	"encoding/hex"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/proc"
	"github.com/agent-dev/agent/plans"
)

// serverRecord is the server's state: what was launched (or adopted), as launched.
type serverRecord struct {
	Generation int       `json:"generation"`
	PID        int       `json:"pid"`
	StartTicks uint64    `json:"start_ticks"`
	PGID       int       `json:"pgid"`
	SID        int       `json:"sid"`
	Marker     string    `json:"marker,omitempty"`
	Adopted    bool      `json:"adopted,omitempty"`
	LogPath    string    `json:"log_path,omitempty"`
	LaunchedAt time.Time `json:"launched_at"`
	ReadyAt    time.Time `json:"ready_at,omitzero"`
	// UnreadySince is when observation first found the server not ready (zero: ready).
	UnreadySince time.Time `json:"unready_since,omitzero"`
	// Verification (server_verify.go): when the launch was verified (ready, settled,
	// smoke test), the smoke test's failure when that alone failed, and why the agent
	// stopped a launch that failed its verification.
	VerifiedAt   time.Time      `json:"verified_at,omitzero"`
	SmokeFailure string         `json:"smoke_failure,omitempty"`
	Failure      *launchFailure `json:"failure,omitempty"`
	// StoppingSince is set while an apply stops this generation (status must not call
	// a generation being stopped ready).
	StoppingSince time.Time `json:"stopping_since,omitzero"`
	// Pending is a launch about to start, recorded before the process exists (no PID
	// yet): an agent killed between the start and the record leaves it, and the next
	// Check adopts the process its marker names instead of starting a second server.
	Pending *serverRecord `json:"pending,omitempty"`
	// Retiring is the generation a migration keeps serving in the container's old
	// instance until the launch in the new one is verified (server_migrate.go): stopped
	// with proof by Finish, then forgotten.
	Retiring *serverRecord `json:"retiring,omitempty"`

	// The launched identity.
	Place   string            `json:"place"`
	Argv    []string          `json:"argv"`
	Command []string          `json:"command"`
	Flags   map[string]string `json:"flags"` // name → displayed value
	Args    []string          `json:"args,omitempty"`
	Env     map[string]string `json:"env,omitempty"`
	Workdir string            `json:"workdir"`
	User    string            `json:"user,omitempty"`
	Home    string            `json:"home,omitempty"` // only when declared
	Port    int               `json:"port,omitempty"`

	// PIDNS names the PID namespace of PID, PGID and SID (lifecycle.Started.NS): ""
	// for this host's (every record written before it existed), else that of the
	// container, on another cluster member, the process runs in.
	PIDNS string `json:"pid_ns,omitempty"`

	// StoppedAt is when the agent stopped it for good (ensure = "absent", agent destroy):
	// the record then only keeps its history (generation, log) for status and for the
	// generation of a later launch.
	StoppedAt time.Time `json:"stopped_at,omitzero"`
	StoppedBy string    `json:"stopped_by,omitempty"`

	// How it is stopped, for stops that do not go through the plan (before a driver
	// change): the stop block at launch.
	StopSignal  int           `json:"stop_signal,omitempty"`
	StopTimeout time.Duration `json:"stop_timeout,omitempty"`

	// Keeping a host serving (server_revert.go): the HOME the launch got; the inputs of
	// the verified generation this launch changed, kept until it is verified (the way
	// back); the change rejected and rolled back; the generation whose inputs this one
	// runs again; how many reverts this server had.
	HomeDir  string          `json:"home_dir,omitempty"`
	LastGood *serverRecord   `json:"last_good,omitempty"`
	Rejected *rejectedChange `json:"rejected,omitempty"`
	RevertOf int             `json:"revert_of,omitempty"`
	Reverts  int             `json:"reverts,omitempty"`
	// The smoke test the last result is of (server_smoke.go: a changed test runs
	// against the running server), and when it ran when not at launch.
	SmokeDigest string    `json:"smoke_digest,omitempty"`
	SmokeRanAt  time.Time `json:"smoke_ran_at,omitzero"`
	// Liveness (server_liveness.go): the wedged generation this one replaced, with the
	// evidence, and how many generations of this server were found wedged.
	Wedge  *wedgeIncident `json:"wedge,omitempty"`
	Wedges int            `json:"wedges,omitempty"`
	// GPUFault is the GPU fault a generation was relaunched for (gpufault.go).
	GPUFault *gpuFaultIncident `json:"gpu_fault,omitempty"`
	// Start is this generation's start (its phases, read from its log once it verified:
	// server_phases.go); PrevStart the newest verified start before it, which a start of
	// the same identity is compared with.
	Start     *startRecord `json:"start,omitempty"`
	PrevStart *startRecord `json:"prev_start,omitempty"`
	// Warm is what the warm-up of this generation's weights did (warm.go).
	Warm *warmRecord `json:"warm,omitempty"`
}

func (r *serverRecord) id() proc.Identity { return proc.Identity{PID: r.PID, StartTicks: r.StartTicks} }

func (r *serverRecord) target() proc.Target {
	return proc.Target{Leader: r.id(), PGID: r.PGID, SID: r.SID, Marker: r.Marker}
}

// record is the identity s would launch, without the process facts.
func (s *Server) record() serverRecord {
	r := serverRecord{
		Place: s.place, Argv: s.argv(), Command: slices.Clone(s.command), Flags: s.flagDisplay(),
		Args: slices.Clone(s.args), Env: maps.Clone(s.env), Workdir: s.workdir, User: s.user, Home: s.home, Port: s.port,
		StopSignal: int(s.stopSignal), StopTimeout: s.stopTimeout,
	}
	// Secrets never reach the state file: values derived from a sensitive variable are
	// recorded as digests, which identityChanges compares just as well. Only those: the
	// other keys of the map are recorded as they are (before per-key sensitivity, one
	// secret digested the whole map; sameRecorded still accepts such records).
	for k, v := range r.Env {
		if s.secretEnv(k) {
			r.Env[k] = secretDigest(v)
		}
	}
	for k, v := range r.Flags {
		if s.secretFlag(k) {
			r.Flags[k] = secretDigest(v)
		}
	}
	if s.argvSensitive {
		r.Argv = []string{secretDigest(strings.Join(r.Argv, "\x00"))}
	}
	return r
}

// secretEnv and secretFlag report whether the env variable or flag named k derives from a
// sensitive variable (never, for a server built from its record alone).
func (s *Server) secretEnv(k string) bool { return s.envSensitive != nil && s.envSensitive(k) }

func (s *Server) secretFlag(k string) bool { return s.flagsSensitive != nil && s.flagsSensitive(k) }

// plainRecord is the identity s would launch with every value as it is: what
// identityChanges compares a record's values against (record() digests the secrets).
func (s *Server) plainRecord() serverRecord {
	return serverRecord{Flags: s.flagDisplay(), Env: maps.Clone(s.env)}
}

// secretDigest stands for a sensitive value in the state file.
func secretDigest(v string) string {
	sum := sha256.Sum256([]byte(v))
	return "sha256:" + hex.EncodeToString(sum[:])
}

// identityChanges lists, attribute by attribute, how the recorded launch differs from
// the plan; every one of them means a restart.
func (s *Server) identityChanges(rec *serverRecord) []agent.Change {
	want := s.record()
	var out []agent.Change
	add := func(c agent.Change) { out = append(out, c.Because(agent.Restarts, agent.ReasonIdentity)) }
	if rec.Place != want.Place {
		add(agent.Set("place", rec.Place, want.Place))
	}
	if !slices.Equal(rec.Command, want.Command) {
		add(agent.Set("command", rec.Command, want.Command))
	}
	plain := s.plainRecord()
	for _, c := range keyChanges("flags", rec.Flags, plain.Flags, flagValue, s.secretFlag) {
		add(c)
	}
	if !slices.Equal(rec.Args, want.Args) {
		add(agent.Set("args", rec.Args, want.Args))
	}
	for _, c := range keyChanges("env", rec.Env, plain.Env, func(v string) any { return v }, s.secretEnv) {
		add(c)
	}
	if rec.Workdir != want.Workdir {
		add(agent.Set("workdir", rec.Workdir, want.Workdir))
	}
	if rec.Home != want.Home {
		add(agent.Set("home", rec.Home, want.Home))
	}
	if rec.User != want.User {
		add(agent.Set("user", rec.User, want.User))
	}
	if len(out) == 0 && !slices.Equal(rec.Argv, want.Argv) {
		add(agent.Set("argv", agent.CommandLine(rec.Argv), agent.CommandLine(want.Argv)))
	}
	return out
}

// keyChanges is the per-key difference of a recorded map and the plan's (plain values),
// in key order, as changes of name["key"] whose values are typed by value (flags are
// recorded as a diff shows them and read back as strings, numbers and booleans; env
// values are strings). A key for which sensitive is true is a sensitive change: its
// values are never shown, and the others' are.
func keyChanges(name string, recorded, plain map[string]string, text func(string) any, sensitive func(string) bool) []agent.Change {
	var out []agent.Change
	for _, k := range unionKeys(recorded, plain) {
		o, hadOld := recorded[k]
		n, hasNew := plain[k]
		if hadOld && hasNew && sameRecorded(o, n) {
			continue
		}
		c := agent.Change{Attr: plans.KeyPath(name, k), HasOld: hadOld, HasNew: hasNew, Sensitive: sensitive(k)}
		if hadOld {
			c.Old = text(o)
			if isDigest(o) {
				// Recorded as a secret (by an older agent, or while it was one): the
				// value is not known, only that it differs.
				c.Old = agent.Raw("(sensitive)")
			}
		}
		if hasNew {
			c.New = text(n)
		}
		out = append(out, c)
	}
	return out
}

// sameRecorded reports whether a recorded value stands for the plan's plain value: the
// value itself, or its digest (a secret; and every key of a map that held one secret, as
// agents before per-key sensitivity recorded it, so that an upgrade relaunches nothing).
func sameRecorded(recorded, plain string) bool {
	return recorded == plain || (isDigest(recorded) && recorded == secretDigest(plain))
}

// isDigest reports whether a recorded value is a secretDigest.
func isDigest(v string) bool {
	return len(v) == len("sha256:")+64 && strings.HasPrefix(v, "sha256:")
}

func unionKeys(a, b map[string]string) []string {
	keys := slices.Collect(maps.Keys(a))
	for k := range b {
		if _, ok := a[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	return keys
}
