package resources

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/zclconf/go-cty/cty"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/cmdline"
	"github.com/agent-dev/agent/internal/engines"
	"github.com/agent-dev/agent/internal/incus"
	"github.com/agent-dev/agent/internal/lifecycle"
	"github.com/agent-dev/agent/internal/proc"
	"github.com/agent-dev/agent/internal/state"
	"github.com/agent-dev/agent/plans"
)

// ServerConfig is the `server` block.
type ServerConfig struct {
	Container      *string            `hcl:"container,optional"`
	Command        []string           `hcl:"command"`
	Flags          cty.Value          `hcl:"flags,optional"`
	Args           []string           `hcl:"args,optional"`
	Env            map[string]string  `hcl:"env,optional"`
	Workdir        *string            `hcl:"workdir,optional"`
	Home           *string            `hcl:"home,optional"`
	User           *string            `hcl:"user,optional"`
	Port           *int               `hcl:"port,optional"`
	Ready          *ServerReadyConfig `hcl:"ready,block"`
	Stop           *ServerStopConfig  `hcl:"stop,block"`
	SmokeTest      *ServerSmokeConfig `hcl:"smoke_test,block"`
	Takeover       *bool              `hcl:"takeover,optional"`
	LogDir         *string            `hcl:"log_dir,optional"`
	KeepLogs       *int               `hcl:"keep_logs,optional"`
	UnhealthyGrace *string            `hcl:"unhealthy_grace,optional"`
	Preflight      *string            `hcl:"preflight,optional"`
	Ensure         *string            `hcl:"ensure,optional"` // "present" (default) or "absent": server_delete.go
}

// ServerReadyConfig is the `ready` block of a server.
type ServerReadyConfig struct {
	HTTP    *string `hcl:"http,optional"`
	LogLine *string `hcl:"log_line,optional"`
	Timeout *string `hcl:"timeout,optional"`
	Settle  *string `hcl:"settle,optional"`
}

// ServerStopConfig is the `stop` block of a server.
type ServerStopConfig struct {
	Signal  *string `hcl:"signal,optional"`
	Timeout *string `hcl:"timeout,optional"`
}

// ServerSmokeConfig is the `smoke_test` block of a server.
type ServerSmokeConfig struct {
	Prompt        string    `hcl:"prompt"`
	Sampling      cty.Value `hcl:"sampling,optional"`
	MaxTokens     *int      `hcl:"max_tokens,optional"`
	Expect        *string   `hcl:"expect,optional"`
	MaxRepetition *float64  `hcl:"max_repetition,optional"`
}

// Defaults of a server block.
const (
	DefaultReadyTimeout   = 20 * time.Minute
	DefaultSettle         = 3 * time.Second
	DefaultStopTimeout    = 90 * time.Second
	DefaultServerLogDir   = "/var/log/agent"
	DefaultKeepLogs       = 5
	DefaultUnhealthyGrace = 5 * time.Minute
	defaultWorkdir        = "/"
)

// Server is a long-running process (an SGLang server) on the host, or inside an Incus
// container (container = NAME, lifecycle.Incus).
//
// Its identity is the exact argv (command, then flags sorted by name and rendered
// `--name value`, true as a bare `--name`, false omitted, then args), the declared
// environment, the working directory, the user and the place. A change to any of them
// is a verified relaunch; nothing else is. A running server that matches and passes
// readiness is never touched, whatever its output looks like.
type Server struct {
	addr, name     string
	host           Host
	container      string    // the Incus instance it runs in; "" on the host
	place          string    // "host" or "container NAME": part of the identity
	retiringPlace  string    // in a view (liveView): the place of the instance a migration retires
	clients        *sync.Map // Incus socket path → *incus.Client, shared by runs and views
	command        []string
	flags          []serverFlag
	args           []string
	env            map[string]string
	workdir, user  string
	home           string // as declared; "" for the default (serverHome)
	port           int
	ready          lifecycle.Ready
	stopSignal     syscall.Signal
	stopTimeout    time.Duration
	smoke          *lifecycle.Smoke
	takeover       bool
	logDir         string
	keepLogs       int
	grace          time.Duration
	enableMetrics  bool
	preflightMode  string                // "warn", "enforce" or "off": does the model fit the GPUs? (preflight.go)
	envSensitive   func(key string) bool // env[key] derives from a sensitive variable (plans.Resource.SensitiveKey)
	flagsSensitive func(key string) bool // flags[key] does
	argvSensitive  bool                  // some flag does: the rendered command line holds a secret
	deletion                             // ensure = "absent", agent destroy, an orphan: server_delete.go
}

var (
	_ agent.Resource  = (*Server)(nil)
	_ agent.Statuser  = (*Server)(nil)
	_ agent.Timeouter = (*Server)(nil)
)

// serverFlag is one rendered flag.
type serverFlag struct {
	name    string
	argv    []string // ["--name", "value"], ["--name"] or nil (false)
	display string   // as a diff shows it: "0.85", "\"NEXTN\"", "true"
}

// ServerKind is the `server` resource kind, acting on h.
func ServerKind(h Host) agent.Kind {
	k := agent.NewKind("server", func(r *plans.Resource, c *ServerConfig) (agent.Resource, hcl.Diagnostics) {
		return bindServer(h, r, c)
	})
	k.Orphan = func(addr string, st *state.Scoped) (agent.Resource, error) { return orphanServer(h, addr, st) }
	k.Guarded = true
	return k
}

var signals = map[string]syscall.Signal{
	"SIGTERM": syscall.SIGTERM, "SIGINT": syscall.SIGINT, "SIGQUIT": syscall.SIGQUIT,
	"SIGHUP": syscall.SIGHUP, "SIGKILL": syscall.SIGKILL, "SIGUSR1": syscall.SIGUSR1, "SIGUSR2": syscall.SIGUSR2,
}

func bindServer(h Host, r *plans.Resource, c *ServerConfig) (agent.Resource, hcl.Diagnostics) {
	var diags hcl.Diagnostics
	bad := func(rng hcl.Range, summary, detail string) {
		diags = append(diags, &hcl.Diagnostic{Severity: hcl.DiagError, Summary: summary, Detail: detail, Subject: rng.Ptr()})
	}
	s := &Server{
		addr: r.Addr, name: r.Name, host: h, command: c.Command, args: c.Args, env: c.Env, clients: new(sync.Map),
		workdir: defaultWorkdir, user: deref(c.User), takeover: deref(c.Takeover),
		logDir: DefaultServerLogDir, keepLogs: DefaultKeepLogs, grace: DefaultUnhealthyGrace,
		ready:      lifecycle.Ready{Timeout: DefaultReadyTimeout, Settle: DefaultSettle},
		stopSignal: syscall.SIGTERM, stopTimeout: DefaultStopTimeout,
		envSensitive:   func(k string) bool { return r.SensitiveKey("env", k) },
		flagsSensitive: func(k string) bool { return r.SensitiveKey("flags", k) },
		argvSensitive:  r.SensitiveAny("flags"),
	}
	s.place = lifecycle.Local{}.Name()
	if c.Container != nil {
		s.container = *c.Container
		s.place = lifecycle.IncusPlace(s.container)
		if !validInstanceName(s.container) {
			bad(r.Range("container"), "Invalid container", fmt.Sprintf("container = %q is not an Incus instance name (letters, digits and dashes, starting with a letter); write container = container.NAME.name.", s.container))
		}
	}
	if len(c.Command) == 0 || c.Command[0] == "" {
		bad(r.Range("command"), "Empty command", `command is the program and its first arguments, e.g. ["python3", "-m", "sglang.launch_server"].`)
	}
	duration := func(p *string, def time.Duration, path ...string) time.Duration {
		if p == nil {
			return def
		}
		d, err := time.ParseDuration(*p)
		if err != nil || d <= 0 {
			bad(r.Range(path...), "Invalid duration", fmt.Sprintf("%s = %q is not a positive duration such as \"90s\" or \"20m\".", strings.Join(path, "."), *p))
			diags[len(diags)-1].Extra = plans.OwnValue
			return def
		}
		return d
	}
	flagPort := 0
	if c.Flags != cty.NilVal && !c.Flags.IsNull() {
		fl, port, msg := renderFlags(c.Flags)
		if msg != "" {
			bad(r.Range("flags"), "Invalid flags", msg)
		}
		s.flags, flagPort = fl, port
		for _, f := range fl {
			if f.name == "enable-metrics" && len(f.argv) > 0 {
				s.enableMetrics = true
			}
		}
	}
	switch {
	case c.Port != nil && (*c.Port <= 0 || *c.Port > 65535):
		bad(r.Range("port"), "Invalid port", fmt.Sprintf("port %d is not a TCP port (1-65535).", *c.Port))
	case c.Port != nil && flagPort != 0 && *c.Port != flagPort:
		bad(r.Range("port"), "Port differs from flags", fmt.Sprintf("port = %d but flags[\"port\"] = %d: the agent would watch one port while the server listens on the other.", *c.Port, flagPort))
	case c.Port != nil:
		s.port = *c.Port
	default:
		s.port = flagPort
	}
	if c.Workdir != nil {
		s.workdir = *c.Workdir
		if !filepath.IsAbs(s.workdir) {
			bad(r.Range("workdir"), "Relative workdir", "workdir must be an absolute path.")
		}
	}
	if c.Home != nil {
		s.home = *c.Home
		if !filepath.IsAbs(s.home) {
			bad(r.Range("home"), "Relative home", "home must be an absolute path.")
		}
	}
	if c.LogDir != nil {
		s.logDir = *c.LogDir
		if !filepath.IsAbs(s.logDir) {
			bad(r.Range("log_dir"), "Relative log_dir", "log_dir must be an absolute path.")
		} else if hasDotDot(s.logDir) {
			bad(r.Range("log_dir"), "log_dir with ..", fmt.Sprintf("log_dir %q has a \"..\" element; write the directory it means (%s).", s.logDir, filepath.Clean(s.logDir)))
		}
	}
	if c.KeepLogs != nil {
		s.keepLogs = *c.KeepLogs
		if s.keepLogs < 1 {
			bad(r.Range("keep_logs"), "Invalid keep_logs", "keep_logs counts the current generation's log, so it is at least 1.")
		}
	}
	s.grace = duration(c.UnhealthyGrace, DefaultUnhealthyGrace, "unhealthy_grace")
	s.bindEnsure(r, c.Ensure, bad)
	switch p := deref(c.Preflight); p {
	case "", "warn":
		s.preflightMode = "warn"
	case "enforce", "off":
		s.preflightMode = p
	default:
		bad(r.Range("preflight"), "Invalid preflight", fmt.Sprintf("preflight is \"warn\" (the default), \"enforce\" or \"off\", not %q.", p))
	}
	if c.Ready != nil {
		s.ready.HTTP = deref(c.Ready.HTTP)
		s.ready.LogLine = deref(c.Ready.LogLine)
		s.ready.Timeout = duration(c.Ready.Timeout, DefaultReadyTimeout, "ready", "timeout")
		s.ready.Settle = settleDuration(c.Ready.Settle, func(rng hcl.Range, summary, detail string) {
			bad(rng, summary, detail)
			diags[len(diags)-1].Extra = plans.OwnValue
		}, r.Range("ready", "settle"))
		if s.ready.HTTP != "" && !strings.HasPrefix(s.ready.HTTP, "/") {
			bad(r.Range("ready", "http"), "Invalid ready.http", "ready.http is a path on the server's port, such as \"/health\".")
		}
		if s.ready.HTTP != "" && s.port == 0 {
			bad(r.Range("ready", "http"), "No port", "ready.http needs the server's port: set port (or flags[\"port\"]).")
		}
	}
	if c.Stop != nil {
		s.stopTimeout = duration(c.Stop.Timeout, DefaultStopTimeout, "stop", "timeout")
		if c.Stop.Signal != nil {
			name := strings.ToUpper(*c.Stop.Signal)
			if !strings.HasPrefix(name, "SIG") {
				name = "SIG" + name
			}
			sig, ok := signals[name]
			if !ok {
				bad(r.Range("stop", "signal"), "Unknown signal", fmt.Sprintf("stop.signal %q is not one of SIGTERM, SIGINT, SIGQUIT, SIGHUP, SIGKILL, SIGUSR1, SIGUSR2.", *c.Stop.Signal))
			}
			s.stopSignal = sig
		}
	}
	if c.SmokeTest != nil {
		sm := &lifecycle.Smoke{Prompt: c.SmokeTest.Prompt, MaxTokens: 512, Expect: deref(c.SmokeTest.Expect), MaxRepetition: -1}
		if c.SmokeTest.MaxTokens != nil {
			sm.MaxTokens = *c.SmokeTest.MaxTokens
		}
		if p := c.SmokeTest.MaxRepetition; p != nil {
			if *p < 0 || *p > 1 {
				bad(r.Range("smoke_test", "max_repetition"), "Invalid max_repetition", "max_repetition is a share of the output, between 0 and 1.")
			}
			sm.MaxRepetition = *p
		}
		if v := c.SmokeTest.Sampling; v != cty.NilVal && !v.IsNull() {
			m, msg := sampling(v)
			if msg != "" {
				bad(r.Range("smoke_test", "sampling"), "Invalid sampling", msg)
			}
			sm.Sampling = m
		}
		for _, f := range s.flags {
			if f.name == "api-key" && len(f.argv) == 2 {
				sm.APIKey = f.argv[1]
			}
		}
		if s.port == 0 {
			bad(r.Range("smoke_test"), "No port", "smoke_test needs the server's port: set port (or flags[\"port\"]).")
		}
		s.smoke = sm
	}
	if diags.HasErrors() {
		return nil, diags
	}
	return s, nil
}

// renderFlags turns the flags map into sorted flags; it also returns flags["port"].
func renderFlags(v cty.Value) ([]serverFlag, int, string) {
	if !v.Type().IsObjectType() && !v.Type().IsMapType() {
		return nil, 0, "flags is a map of flag names (without --) to strings, numbers or booleans."
	}
	if !v.IsWhollyKnown() {
		return nil, 0, "flags must be known when the plan is read."
	}
	var out []serverFlag
	port := 0
	var problems []string
	for k, val := range v.AsValueMap() {
		name := strings.TrimPrefix(k, "--")
		f := serverFlag{name: name}
		if msg := flagEdge(k, val); msg != "" {
			problems = append(problems, msg)
			continue
		}
		var value any
		switch {
		case val.IsNull():
			continue
		case val.Type() == cty.String && name == "port":
			// A port written as a string is read as the number it names (flagEdge
			// refused any other string), so the agent watches the port the server gets.
			port, _ = strconv.Atoi(val.AsString())
			value = val.AsString()
			f.display = strconv.Itoa(port)
		case val.Type() == cty.String:
			value = val.AsString()
			f.display = strconv.Quote(val.AsString())
		case val.Type() == cty.Number:
			value = val.AsBigFloat()
			f.display = cmdline.Number(val.AsBigFloat())
			if name == "port" {
				port, _ = strconv.Atoi(f.display)
			}
		case val.Type() == cty.Bool:
			value = val.True()
			f.display = strconv.FormatBool(val.True())
		default:
			problems = append(problems, fmt.Sprintf("flags[%q] is a %s; a flag is a string, a number or a boolean (true: a bare --%s, false: omitted).", k, val.Type().FriendlyName(), name))
			continue
		}
		f.argv, _ = cmdline.Flag(name, value) // value is one of Flag's types
		out = append(out, f)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	sort.Strings(problems)
	return out, port, strings.Join(problems, " ")
}

// sampling turns the sampling map into JSON values.
func sampling(v cty.Value) (map[string]any, string) {
	if !v.Type().IsObjectType() && !v.Type().IsMapType() {
		return nil, "sampling is a map of OpenAI request fields, e.g. { temperature = 0.7, top_p = 0.8 }."
	}
	m := map[string]any{}
	for k, val := range v.AsValueMap() {
		switch {
		case val.IsNull():
		case val.Type() == cty.Number:
			f, _ := val.AsBigFloat().Float64()
			m[k] = f
			if val.AsBigFloat().IsInt() {
				i, _ := val.AsBigFloat().Int64()
				m[k] = i
			}
		case val.Type() == cty.String:
			m[k] = val.AsString()
		case val.Type() == cty.Bool:
			m[k] = val.True()
		default:
			return nil, fmt.Sprintf("sampling[%q] is a %s; use numbers, strings or booleans.", k, val.Type().FriendlyName())
		}
	}
	return m, ""
}

// argv is the exact command line.
func (s *Server) argv() []string {
	out := slices.Clone(s.command)
	for _, f := range s.flags {
		out = append(out, f.argv...)
	}
	return append(out, s.args...)
}

// flagDisplay is the flags as a diff shows them, by name.
func (s *Server) flagDisplay() map[string]string {
	m := make(map[string]string, len(s.flags))
	for _, f := range s.flags {
		m[f.name] = f.display
	}
	return m
}

// Timeout bounds one step: a stop, a launch until ready, and the smoke test.
func (s *Server) Timeout() time.Duration {
	return s.stopTimeout + proc.DefaultKillWait + lifecycle.PortWait + lifecycle.GPUWait +
		s.ready.Timeout + s.ready.Settle + lifecycle.DefaultSmokeTimeout + time.Minute
}

// errNoInstance is wrapped when the server's container does not exist (yet).
var errNoInstance = errors.New("container does not exist")

// errNoEndpoint is wrapped when the agent cannot reach the server's port in its
// container; the lifecycle is returned with it, good for everything but HTTP.
var errNoEndpoint = errors.New("server port unreachable from the agent")

// lifecycle is the lifecycle of the server's place: the host, or its container (which
// must exist and run; errNoInstance when it does not exist).
func (s *Server) lifecycle(ctx context.Context, env *agent.Env) (*lifecycle.Lifecycle, error) {
	return s.lifecycleAt(ctx, env, s.place)
}

// lifecycleAt is the lifecycle of place, "host" or "container NAME": a recorded launch
// is stopped where it runs, also when the plan moved the server. The server's own
// place gets its endpoint; another place is only observed and stopped.
func (s *Server) lifecycleAt(ctx context.Context, env *agent.Env, place string) (*lifecycle.Lifecycle, error) {
	h := s.host.withDefaults()
	name, inContainer := strings.CutPrefix(place, lifecycle.IncusPlace(""))
	if !inContainer {
		return &lifecycle.Lifecycle{Place: lifecycle.Local{Proc: h.Proc}, GPU: h.GPU}, nil
	}
	r := s.incusRunner(env, name)
	c := r.Client
	lc := &lifecycle.Lifecycle{Place: r, GPU: h.GPU}
	if place != s.place || s.absent {
		return lc, nil // observed and stopped only
	}
	qctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	inst, _, err := c.GetInstance(qctx, name)
	if incus.IsNotFound(err) {
		return nil, fmt.Errorf("container %s: %w", name, errNoInstance)
	}
	if err != nil {
		return nil, fmt.Errorf("container %s: %w", name, reachErr(c, err))
	}
	if !inst.Running() {
		return nil, fmt.Errorf("container %s is %s: the server runs inside it, so it must run (running = true on its container block, or incus start %s): %w",
			name, strings.ToLower(inst.Status), name, lifecycle.ErrNotRunning)
	}
	if s.port > 0 && (s.ready.HTTP != "" || s.smoke != nil || s.enableMetrics) {
		st, err := c.InstanceState(qctx, name)
		if err != nil {
			return nil, fmt.Errorf("container %s: %w", name, err)
		}
		ep, err := lifecycle.IncusEndpoint(inst, st, s.port)
		if err != nil {
			return lc, fmt.Errorf("%w: %w", errNoEndpoint, err)
		}
		r.Endpoints = map[int]string{s.port: ep}
	}
	return lc, nil
}

// hostPath is where the agent reads rec's log: through its place's lifecycle when
// that is lc's, on the host for a host record; "" when it cannot be read.
func hostPath(ctx context.Context, lc *lifecycle.Lifecycle, rec *serverRecord) string {
	if rec.LogPath == "" {
		return ""
	}
	if lc != nil && lc.Place.Name() == rec.Place {
		p, err := lc.Place.HostPath(ctx, rec.LogPath)
		if err != nil {
			return ""
		}
		return p
	}
	if rec.Place == (lifecycle.Local{}).Name() || rec.Place == "" {
		return rec.LogPath
	}
	return ""
}

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
func (s *Server) secretEnv(k string) bool  { return s.envSensitive != nil && s.envSensitive(k) }
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

// serverDetail is what Check decided, for Apply.
type serverDetail struct {
	// prev is the previous record (its generation counts; its process, or what is left
	// of it, is stopped first when stop is set).
	prev *serverRecord
	stop bool
	// takeover is a foreign process holding the port, stopped because takeover = true.
	takeover *proc.Target
	// lastGen is the generation of a record stopped for good (server_delete.go): a new
	// launch continues its numbering.
	lastGen int
	// verify: prev runs and matches, but its launch was never verified (server_verify.go).
	verify bool
	// stopped is set by Apply once it stopped prev's live process (server_checkfirst.go).
	stopped bool
	// migrate: prev runs in the instance its container's migration retires; it is kept
	// running (Retiring) while the new generation launches (server_migrate.go).
	migrate bool
	// adopt: a running process found to be this server; the engine records it (the
	// diff's record update) and nothing else is done.
	adopt bool
}

// Check observes the recorded process in /proc and its readiness, and the port.
func (s *Server) Check(ctx context.Context, env *agent.Env) (*agent.Diff, error) {
	if s.absent {
		return s.checkAbsent(ctx, env)
	}
	s = s.liveView(env)
	var rec serverRecord
	has, err := env.State.Load(&rec)
	if err != nil {
		return nil, err
	}
	stopped := has && !rec.StoppedAt.IsZero()
	if stopped {
		has = false // stopped for good: a launch is a new start, numbered after it
	}
	var found *agent.RecordUpdate // a pending launch settled
	if has && rec.Pending != nil {
		if has, found, err = s.recoverPending(env, &rec); err != nil {
			return nil, err
		}
	}
	d, err := s.observe(ctx, env, has, stopped, &rec)
	if d != nil && d.Record == nil {
		d.Record = found
	}
	if d != nil && has {
		d.Unfinished = unfinished(&rec)
	}
	return d, err
}

// observe is Check past the record: has says whether rec names a launch (stopped: a
// record stopped for good, whose generation a launch continues).
func (s *Server) observe(ctx context.Context, env *agent.Env, has, stopped bool, rec0 *serverRecord) (*agent.Diff, error) {
	rec := *rec0
	var err error
	// PIDs and start times in the namespace the record names (server_remote.go).
	alive := false
	if has {
		if alive, err = s.recordProcs(ctx, env, &rec).Alive(ctx, rec.id()); err != nil {
			return nil, fmt.Errorf("observe pid %d: %w", rec.PID, err)
		}
	}
	lc, err := s.lifecycle(ctx, env)
	var missing error // the container does not exist yet (a first plan)
	if errors.Is(err, errNoInstance) {
		missing, err = err, nil
	}
	var noEndpoint error // a plan may add the proxy device with this apply
	if errors.Is(err, errNoEndpoint) {
		noEndpoint, err = err, nil
	}
	if err != nil {
		return nil, err
	}
	if alive && noEndpoint != nil && len(s.identityChanges(&rec)) == 0 {
		// Never a relaunch for what the agent cannot probe.
		d := agent.NoChange()
		d.Warnings = append(d.Warnings, fmt.Sprintf("pid %d runs the plan's server, but its readiness cannot be probed: %v", rec.PID, noEndpoint))
		return d, nil
	}
	d, err := s.check(ctx, env, lc, has, alive, &rec, missing)
	if d != nil {
		d.Derive()
		if det, ok := d.Detail.(*serverDetail); ok && stopped {
			det.lastGen = rec.Generation
		}
	}
	if d != nil && noEndpoint != nil {
		d.Warnings = append(d.Warnings, noEndpoint.Error())
	}
	if d != nil && has && rec.Retiring != nil {
		d.Warnings = append(d.Warnings, fmt.Sprintf("migration: generation %d (pid %d) in %s keeps serving until this one and everything that depends on it verified; then it is stopped, verified",
			rec.Retiring.Generation, rec.Retiring.PID, rec.Retiring.Place))
	}
	if err == nil && d != nil && launches(d) {
		var prev *serverRecord
		if has {
			prev = &rec
		}
		if msg, fits := s.preflight(ctx, prev); !fits {
			if s.preflightMode == "enforce" {
				return nil, fmt.Errorf("preflight = \"enforce\": not launching: %s", msg)
			}
			d.Warnings = append(d.Warnings, "preflight: "+msg)
		}
	}
	return d, err
}

func (s *Server) check(ctx context.Context, env *agent.Env, lc *lifecycle.Lifecycle, has, alive bool, rec0 *serverRecord, missing error) (*agent.Diff, error) {
	rec := *rec0
	if alive {
		if changes := s.identityChanges(&rec); len(changes) > 0 {
			if s.migrating(&rec) {
				d := &agent.Diff{Changes: changes, Detail: &serverDetail{prev: &rec, migrate: true}}
				s.markMigration(d, &rec)
				return d, nil
			}
			return &agent.Diff{Changes: changes, Detail: &serverDetail{prev: &rec, stop: true}}, nil
		}
		if !rec.verified() {
			return s.verifyDiff(env, &rec), nil
		}
		return s.checkReady(ctx, env, lc, &rec)
	}

	det := &serverDetail{stop: has}
	d := &agent.Diff{Detail: det}
	if has {
		det.prev = &rec
		c := agent.Set("process", agent.Raw(fmt.Sprintf("pid %d (generation %d) is gone", rec.PID, rec.Generation)), agent.Raw("a new generation"))
		c.Note = "relaunch"
		d.Add(c.Because(agent.Restarts, agent.ReasonGone))
		if p := hostPath(ctx, lc, &rec); p != "" {
			if f, ok := lifecycle.Failure(p); ok {
				d.Warnings = append(d.Warnings, fmt.Sprintf("generation %d's log shows %s", rec.Generation, f))
			}
		}
		d.Changes = append(d.Changes, s.identityChanges(&rec)...)
	} else {
		d.Add(agent.Added("argv", agent.CommandLine(s.argv())).Because(agent.Creates, agent.ReasonMissing))
		// Each variable: the values of those that are not secrets.
		for _, c := range keyChanges("env", nil, s.env, func(v string) any { return v }, s.secretEnv) {
			d.Add(c.Because(agent.Creates, agent.ReasonMissing))
		}
		if s.port > 0 {
			d.Add(agent.Added("port", s.port).Because(agent.Creates, agent.ReasonMissing))
		}
	}
	if missing != nil {
		d.Warnings = append(d.Warnings, fmt.Sprintf("%v yet: the server is launched in it once it does", missing))
		return d, nil
	}
	procs := lc.Place.Procs(ctx)
	if s.port == 0 {
		return d, nil
	}
	owner, err := s.portHolder(ctx, procs, det.prev)
	if err != nil || owner == nil {
		return d, err
	}
	if s.matches(ctx, procs, owner) {
		if peer := recordedElsewhere(env, owner); peer != "" {
			d.Warnings = append(d.Warnings, fmt.Sprintf("port %d is held by pid %d, which runs this server's command line but is recorded as %s's: not adopted (two records never name one process); write moved { from = %s  to = %s } to rename it without a restart",
				s.port, owner.PID, peer, peer, s.addr))
			return d, nil
		}
		adopt := s.record()
		adopt.Generation = 0
		if det.prev != nil {
			adopt.Generation = det.prev.Generation
			adopt.LogPath = ""
		}
		adopt.PID, adopt.StartTicks, adopt.Adopted = owner.PID, owner.StartTicks, true
		if adopt.PIDNS, err = lc.Namespace(ctx); err != nil {
			return nil, fmt.Errorf("adopt pid %d: %w", owner.PID, err)
		}
		if owner.PGRP == owner.PID {
			adopt.PGID = owner.PGRP
		}
		if owner.Session == owner.PID {
			adopt.SID = owner.Session
		}
		adopt.LaunchedAt = time.Time{}
		if st, err := procStart(ctx, procs, owner.StartTicks); err == nil {
			adopt.LaunchedAt = st
		}
		return s.adoptDiff(ctx, env, lc, &adopt)
	}
	desc := describeProc(ctx, procs, owner.PID)
	if !s.takeover {
		return nil, fmt.Errorf("port %d is held by %s, which this agent did not start and which does not run this server's command line; it was not touched: stop it yourself, or set takeover = true to let the agent stop it", s.port, desc)
	}
	t := foreignTarget(*owner)
	det.takeover = &t
	c := agent.Removed("takeover", agent.Raw(desc))
	c.Note = "takeover = true: stopped, verified"
	effect := agent.Replaces // a foreign process gives way to the plan's
	if det.prev != nil {
		effect = agent.Restarts // the relaunch stops it on the way
	}
	d.Add(c.Because(effect, agent.ReasonForeign))
	return d, nil
}

// adoptDiff is the adoption of a process the agent just proved runs exactly the plan's
// command line (this PID, with this start time): a planned change, as a Terraform import
// is, that nothing on the host changes; apply records it (the diff's record update) and
// restarts nothing. The adopted server is then judged as a recorded one (checkReady).
func (s *Server) adoptDiff(ctx context.Context, env *agent.Env, lc *lifecycle.Lifecycle, adopt *serverRecord) (*agent.Diff, error) {
	d, err := s.checkReady(ctx, env, lc, adopt)
	if err != nil {
		return nil, err
	}
	c := agent.Added("process", agent.Raw(fmt.Sprintf("pid %d, generation %d", adopt.PID, adopt.Generation)))
	c.Note = fmt.Sprintf("adopt pid %d: it already runs this exact command line on port %d; recorded as this server's, not restarted", adopt.PID, s.port)
	d.Changes = append([]agent.Change{c.Because(agent.Adopts, agent.ReasonUnrecorded)}, d.Changes...)
	d.Record = agent.SaveRecord(adopt, fmt.Sprintf("adopted pid %d, which runs this server's exact command line", adopt.PID))
	if d.Detail == nil {
		d.Detail = &serverDetail{adopt: true}
	}
	return d, nil
}

// checkReady judges a running server whose identity matches: ready is a no-op, and so
// is not ready within its grace; past it, a relaunch. When it finds the server not ready
// for the first time, or ready again, the diff carries rec updated.
func (s *Server) checkReady(ctx context.Context, env *agent.Env, lc *lifecycle.Lifecycle, rec *serverRecord) (*agent.Diff, error) {
	if lc == nil { // cannot be: the process runs in it
		return nil, fmt.Errorf("pid %d runs, but its container %s does not exist", rec.PID, s.container)
	}
	why := s.notReady(ctx, lc, rec)
	now := env.Now()
	if why == "" {
		d := agent.NoChange()
		if !rec.UnreadySince.IsZero() {
			rec.UnreadySince = time.Time{}
			d.Record = agent.SaveRecord(rec, fmt.Sprintf("pid %d is ready again", rec.PID))
		}
		return d, nil
	}
	var found *agent.RecordUpdate
	if rec.UnreadySince.IsZero() {
		rec.UnreadySince = now
		found = agent.SaveRecord(rec, fmt.Sprintf("pid %d found not ready: %s", rec.PID, why))
	}
	limit := rec.UnreadySince.Add(s.grace)
	if l := rec.LaunchedAt.Add(s.ready.Timeout); !rec.Adopted && l.After(limit) {
		limit = l
	}
	if now.Before(limit) {
		d := agent.NoChange()
		d.Record = found
		d.Warnings = append(d.Warnings, fmt.Sprintf("pid %d is not ready (%s) since %s; it is relaunched if still not ready at %s (unhealthy_grace %s)",
			rec.PID, why, rec.UnreadySince.Format(time.TimeOnly), limit.Format(time.TimeOnly), s.grace))
		return d, nil
	}
	c := agent.Set("readiness", agent.Raw(fmt.Sprintf("not ready since %s: %s", agent.HumanTime(rec.UnreadySince), why)), agent.Raw("a new generation"))
	c.Note = "restart: unhealthy for longer than unhealthy_grace " + s.grace.String()
	return &agent.Diff{Changes: []agent.Change{c.Because(agent.Restarts, agent.ReasonUnhealthy)}, Detail: &serverDetail{prev: rec, stop: true}, Record: found}, nil
}

// notReady probes readiness once; "" means ready. ready.http is the live probe; the
// log line counts only when there is no HTTP probe (it says the server came up, not
// that it still works).
func (s *Server) notReady(ctx context.Context, lc *lifecycle.Lifecycle, rec *serverRecord) string {
	if s.ready.HTTP != "" {
		if err := lc.ProbeHTTP(ctx, s.port, s.ready.HTTP); err != nil {
			return err.Error()
		}
		return ""
	}
	if s.ready.LogLine != "" && rec.LogPath != "" && rec.ReadyAt.IsZero() {
		// A generation's log only grows: once its launch saw the line (ReadyAt), it is
		// there for good, however much log follows it.
		p := hostPath(ctx, lc, rec)
		if p == "" {
			return "log: " + rec.LogPath + " cannot be read in " + rec.Place
		}
		m, err := lifecycle.ScanLog(ctx, p)
		if err != nil {
			return "log: " + err.Error()
		}
		if !m.Ready && !logHas(ctx, p, s.ready.LogLine) {
			return fmt.Sprintf("%q not in generation %d's log", s.ready.LogLine, rec.Generation)
		}
	}
	return ""
}

// logHas reports whether a line of the file at path contains line, reading the whole
// file (a launch the agent did not see get ready, such as an adopted one, has no
// ReadyAt; the line may be far from the end).
func logHas(ctx context.Context, path, line string) bool {
	f, err := os.Open(path)
	if err != nil {
		return false
	}
	defer f.Close()
	const maxLine = 1 << 20
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), maxLine)
	sc.Split(func(data []byte, atEOF bool) (int, []byte, error) {
		if i := bytes.IndexByte(data, '\n'); i >= 0 {
			return i + 1, data[:i], nil
		}
		if len(data) >= maxLine || atEOF && len(data) > 0 {
			return len(data), data, nil // the end, or a giant line in pieces
		}
		return 0, nil, nil
	})
	for sc.Scan() {
		if ctx.Err() != nil {
			return false
		}
		if strings.Contains(sc.Text(), line) {
			return true
		}
	}
	return false
}

// portHolder returns the process listening on the port that is not part of the
// previous launch (whose leftovers the stop takes care of), or nil.
func (s *Server) portHolder(ctx context.Context, procs lifecycle.Procs, prev *serverRecord) (*proc.Stat, error) {
	pids, err := procs.PortOwners(ctx, s.port)
	if err != nil {
		return nil, fmt.Errorf("port %d: %w", s.port, err)
	}
	for _, pid := range pids {
		st, err := procs.Stat(ctx, pid)
		if err != nil || st.Dead() {
			continue
		}
		if prev != nil && ours(ctx, procs, st, prev) {
			continue
		}
		return &st, nil
	}
	return nil, nil
}

// ours reports whether st belongs to the recorded launch: it carries the launch's
// marker, or it is in the launch's group or session (started no earlier than the
// leader) while the leader, alive or not yet reaped, still is. Without the leader the
// group's number may have been reused by a foreign process (proc.FS.Stop follows the
// same rule), and only the marker proves anything.
func ours(ctx context.Context, procs lifecycle.Procs, st proc.Stat, rec *serverRecord) bool {
	if st.StartTicks >= rec.StartTicks && ((rec.PGID != 0 && st.PGRP == rec.PGID) || (rec.SID != 0 && st.Session == rec.SID)) {
		leader, err := procs.Stat(ctx, rec.PID)
		if err == nil && leader.StartTicks == rec.StartTicks &&
			((rec.PGID != 0 && leader.PGRP == rec.PGID && st.PGRP == rec.PGID) || (rec.SID != 0 && leader.Session == rec.SID && st.Session == rec.SID)) {
			return true
		}
	}
	if rec.Marker != "" {
		if env, err := procs.Environ(ctx, st.PID); err == nil && slices.Contains(env, rec.Marker) {
			return true
		}
	}
	return false
}

// matches reports whether a process the agent did not start runs exactly this server:
// the same argv, the declared environment, and the declared workdir when one is set.
// It returns the stat of its topmost ancestor with the same argv (the launcher).
func (s *Server) matches(ctx context.Context, procs lifecycle.Procs, st *proc.Stat) bool {
	want := s.argv()
	argv, err := procs.Cmdline(ctx, st.PID)
	if err != nil || !slices.Equal(argv, want) {
		return false
	}
	// Climb to the launcher: SGLang's children keep the parent's argv.
	for st.PPID > 1 {
		parent, err := procs.Stat(ctx, st.PPID)
		if err != nil || parent.Dead() {
			break
		}
		pargv, err := procs.Cmdline(ctx, parent.PID)
		if err != nil || !slices.Equal(pargv, want) {
			break
		}
		*st = parent
	}
	if len(s.env) > 0 {
		env, err := procs.Environ(ctx, st.PID)
		if err != nil {
			return false
		}
		for k, v := range s.env {
			if !slices.Contains(env, k+"="+v) {
				return false
			}
		}
	}
	if s.workdir != defaultWorkdir {
		if cwd, err := procs.Cwd(ctx, st.PID); err != nil || cwd != s.workdir {
			return false
		}
	}
	return s.sameUser(ctx, procs, st.PID)
}

// foreignTarget stops a process the agent did not start: its group and session only
// when it leads them.
func foreignTarget(st proc.Stat) proc.Target {
	t := proc.Target{Leader: st.Identity()}
	if st.PGRP == st.PID {
		t.PGID = st.PGRP
	}
	if st.Session == st.PID {
		t.SID = st.Session
	}
	return t
}

func describeProc(ctx context.Context, procs lifecycle.Procs, pid int) string {
	d := "pid " + strconv.Itoa(pid)
	if argv, err := procs.Cmdline(ctx, pid); err == nil && len(argv) > 0 {
		d += " " + strconv.Quote(strings.Join(argv, " "))
	}
	if _, uid, err := procs.UIDs(ctx, pid); err == nil {
		d += " (uid " + strconv.FormatUint(uint64(uid), 10) + ")"
	}
	return d
}

func procStart(ctx context.Context, procs lifecycle.Procs, ticks uint64) (time.Time, error) {
	boot, err := procs.BootTime(ctx)
	if err != nil {
		return time.Time{}, err
	}
	return proc.StartTime(boot, ticks), nil
}

// Apply adopts, or stops what must stop (verified) and launches a new generation
// (verified: alive, log grown, ready, smoke test).
func (s *Server) Apply(ctx context.Context, env *agent.Env, d *agent.Diff) (err error) {
	det, ok := d.Detail.(*serverDetail)
	if !ok {
		return fmt.Errorf("internal error: diff detail is %T", d.Detail)
	}
	if s.absent {
		return s.applyAbsent(ctx, env, det)
	}
	if det.adopt {
		return nil // recorded by the engine, from the diff: nothing on the host changes
	}
	s = s.liveView(env)
	lc, err := s.lifecycle(ctx, env)
	if err != nil {
		return err // before anything is stopped
	}
	if det.verify {
		return s.verifyRecorded(ctx, env, lc, det.prev)
	}
	if err := s.checkBeforeBreak(ctx, env, lc, det); err != nil {
		return err // before anything is stopped
	}
	defer func() { err = det.afterBreak(err) }()
	prevGen := det.lastGen
	if det.prev != nil {
		prevGen = det.prev.Generation
	}
	if det.stop && det.prev != nil {
		// Stopped where it runs: the recorded place, which the plan may have changed.
		plc, err := s.lifecycleAt(ctx, env, det.prev.Place)
		if det.prev.Place == "" || det.prev.Place == s.place {
			plc, err = lc, nil
		}
		if err != nil {
			return err
		}
		port := det.prev.Port
		if port == 0 {
			port = s.port
		}
		if det.takeover != nil {
			// A foreign process holds the port, not the previous generation (dead, or
			// gone from it): this stop cannot free it; the takeover's stop below does,
			// verified, and the port is checked again before the launch.
			port = 0
		}
		s.markStopping(env, det.prev, true)
		rep, err := plc.StopIn(ctx, det.prev.PIDNS, det.prev.target(), s.stopSignal, s.stopTimeout, port)
		if err != nil {
			s.markStopping(env, det.prev, false)
			return fmt.Errorf("stop generation %d (pid %d): %w", det.prev.Generation, det.prev.PID, err)
		}
		env.Log.Info("stopped", "generation", det.prev.Generation, "pid", det.prev.PID, "result", lifecycle.Summary(rep))
		det.stopped = !rep.LeaderGone
	}
	if det.takeover != nil {
		rep, err := lc.Stop(ctx, *det.takeover, s.stopSignal, s.stopTimeout, s.port)
		if err != nil {
			return fmt.Errorf("takeover of pid %d: %w", det.takeover.Leader.PID, err)
		}
		env.Log.Info("took over the port", "pid", det.takeover.Leader.PID, "result", lifecycle.Summary(rep))
	}
	procs := lc.Place.Procs(ctx)
	if s.port > 0 {
		if err := procs.PortFree(ctx, s.port, 2*time.Second); err != nil {
			if errors.Is(err, proc.ErrPortHeld) && !s.takeover {
				return fmt.Errorf("not launching: %w; the holder was not started by this agent and was not touched (takeover = true lets the agent stop it)", err)
			}
			return fmt.Errorf("not launching: %w", err)
		}
	}
	logDir, err := lc.Place.HostPath(ctx, s.logDir)
	if err != nil {
		return err
	}
	gen, err := lifecycle.NextGeneration(logDir, s.name, prevGen)
	if err != nil {
		return err
	}
	marker := fmt.Sprintf("AGENT_SERVER=%s#%d@%d", s.addr, gen, env.Now().UnixNano())
	want := s.record()
	spec := lifecycle.Spec{Argv: s.argv(), Env: s.env, Workdir: s.workdir, User: s.user, Marker: marker, Home: s.serverHome(env)}
	// The intent goes to state before the process exists (see serverRecord.Pending).
	intent := want
	intent.Generation, intent.Marker = gen, marker
	intent.LogPath = lifecycle.LogFile{Dir: s.logDir, Name: s.name, Generation: gen}.Path()
	retiring := retiringOf(det) // kept serving until Finish (a migration), in every record from here
	intent.Retiring = retiring
	var held serverRecord
	if det.prev != nil {
		held = *det.prev
	}
	held.Pending = &intent
	if err := env.State.Save(&held); err != nil {
		return fmt.Errorf("record the launch of generation %d before it starts: %w", gen, err)
	}
	var rec serverRecord
	x, err := lc.Launch(ctx, lifecycle.LaunchOptions{
		Name: s.name, LogDir: s.logDir, KeepLogs: s.keepLogs, Generation: gen, Spec: spec, Port: s.port,
		Ready: s.ready, Smoke: s.smoke,
		OnStarted: func(x *lifecycle.Launched) error {
			rec = want
			rec.Generation, rec.PID, rec.StartTicks, rec.PGID, rec.SID = gen, x.ID.PID, x.ID.StartTicks, x.PGID, x.SID
			rec.PIDNS = x.NS
			rec.Marker, rec.LogPath, rec.LaunchedAt = marker, x.LogPath, x.LaunchedAt
			rec.Retiring = retiring
			env.Log.Info("launched", "generation", gen, "pid", x.ID.PID, "log", x.LogPath)
			return env.State.Save(&rec)
		},
	})
	if x == nil {
		// Nothing started: the intent is void.
		var serr error
		if held.Pending = nil; det.prev != nil {
			serr = env.State.Save(&held)
		} else {
			serr = env.State.Delete()
		}
		return errors.Join(err, serr)
	}
	return s.recordVerification(env, &rec, x, err)
}

// recoverPending settles a launch recorded as pending by an agent that stopped before
// recording its process: the live session leader that carries the pending marker (the
// lifecycle starts every server as one) becomes the record, as launched; with none,
// the intent is void. It returns whether a record remains, and the record update that
// says so (the engine keeps it: an observation writes nothing).
func (s *Server) recoverPending(env *agent.Env, rec *serverRecord) (bool, *agent.RecordUpdate, error) {
	p := *rec.Pending
	if settled, found, err := s.recoverPendingRemote(env, rec); settled || err != nil {
		return rec.PID > 0, found, err
	}
	all, err := s.host.Proc.All()
	if err != nil {
		return false, nil, fmt.Errorf("look for pending generation %d: %w", p.Generation, err)
	}
	for _, st := range all {
		if st.Dead() || st.PID != st.Session {
			continue
		}
		if envv, err := s.host.Proc.Environ(st.PID); err != nil || !slices.Contains(envv, p.Marker) {
			continue
		}
		p.PID, p.StartTicks, p.PGID, p.SID = st.PID, st.StartTicks, st.PGRP, st.Session
		if boot, err := s.host.Proc.BootTime(); err == nil {
			p.LaunchedAt = proc.StartTime(boot, st.StartTicks)
		}
		*rec = p
		return true, pendingFound(rec, ""), nil
	}
	return voidPending(rec)
}

// pendingFound is the record update of a pending launch found running (in container,
// "" on the host).
func pendingFound(rec *serverRecord, container string) *agent.RecordUpdate {
	where := ""
	if container != "" {
		where = " in container " + container
	}
	return agent.SaveRecord(rec, fmt.Sprintf("adopting the launch of generation %d (pid %d%s), which an agent that stopped before recording it left pending",
		rec.Generation, rec.PID, where))
}

// voidPending forgets a pending launch whose process was not found: the record as it
// was before it, or none. It returns whether a record remains.
func voidPending(rec *serverRecord) (bool, *agent.RecordUpdate, error) {
	why := fmt.Sprintf("the pending launch of generation %d never started", rec.Pending.Generation)
	rec.Pending = nil
	if rec.PID == 0 {
		return false, agent.DeleteRecord(why), nil
	}
	return true, agent.SaveRecord(rec, why), nil
}

// Status is the live state: the process, its generation's log and serving metrics,
// readiness, and the smoke test's verdict. A failed smoke test is "degraded", and the
// server is left alone.
func (s *Server) Status(ctx context.Context, env *agent.Env) (*agent.Status, error) {
	var rec serverRecord
	has, err := env.State.Load(&rec)
	if err != nil {
		return nil, err
	}
	if s.absent || (has && !rec.StoppedAt.IsZero()) {
		return s.absentStatus(ctx, env, has, &rec)
	}
	if !has {
		return s.unlaunchedStatus(ctx, env), nil
	}
	s = s.liveView(env)
	lc, err := s.lifecycle(ctx, env)
	if err != nil && !errors.Is(err, errNoEndpoint) {
		return &agent.Status{Healthy: false, Summary: fmt.Sprintf("generation %d (pid %d) cannot be observed: %v", rec.Generation, rec.PID, err)}, nil
	}
	procs := lc.ProcsIn(ctx, rec.PIDNS)
	if rec.Place != s.place {
		procs = s.recordProcs(ctx, env, &rec)
	}
	// Metrics are the numbers agent run exports as agent_server_<key>{resource="server.<name>", kind="server"}.
	st := &agent.Status{Healthy: true, Metrics: map[string]float64{
		"up": 0, "ready": 0, "generation": float64(rec.Generation), "restarts": float64(max(rec.Generation-1, 0)),
	}}
	field := func(f agent.Field) { st.Fields = append(st.Fields, f) }
	now := env.Now()
	alive, err := procs.Alive(ctx, rec.id())
	if err != nil {
		return nil, fmt.Errorf("observe pid %d: %w", rec.PID, err)
	}
	field(agent.NumberField("pid", "pid", rec.PID))
	if t, err := procStart(ctx, procs, rec.StartTicks); err == nil {
		field(agent.AgeField("started_at", "started", t, now))
	}
	gen := strconv.Itoa(rec.Generation)
	if rec.Adopted {
		gen += " (adopted: not launched by this agent)"
	}
	field(agent.NumberField("generation", "generation", rec.Generation).WithText(gen))
	if r := rec.Retiring; r != nil {
		field(agent.TextField("retiring", "retiring", fmt.Sprintf("generation %d (pid %d) in %s: a migration's old server, stopped once this one and its dependents verified", r.Generation, r.PID, r.Place)))
	}
	var m engines.Metrics
	if s.container != "" {
		field(agent.TextField("container", "container", s.container))
		if member := incusMember(ctx, lc); member != "" {
			field(agent.TextField(agent.MemberField, "member", member))
		}
		if err != nil {
			field(agent.TextField("endpoint", "endpoint", err.Error()))
		}
	}
	logPath := hostPath(ctx, lc, &rec)
	if rec.LogPath != "" {
		field(agent.TextField("log", "log", rec.LogPath))
		m, err = lifecycle.ScanLog(ctx, logPath)
		switch {
		case err != nil:
			field(agent.TextField("newest_line", "newest line", "log unreadable: "+err.Error()))
		case m.LastLineTime.IsZero() && m.Lines == 0:
			field(agent.TextField("newest_line", "newest line", fmt.Sprintf("none: generation %d's log has no line yet", rec.Generation)))
		case m.LastLineTime.IsZero():
			field(agent.TextField("newest_line", "newest line", fmt.Sprintf("%d lines, none with a time (generation %d)", m.Lines, rec.Generation)))
		default:
			field(agent.AgeField("newest_line_at", "newest line", m.LastLineTime, now))
		}
	}
	if !alive {
		st.Healthy = false
		st.Summary = fmt.Sprintf("not running: pid %d (generation %d) is gone", rec.PID, rec.Generation)
		if logPath != "" {
			if f, ok := lifecycle.Failure(logPath); ok {
				field(agent.TextField("failure", "failure", f.String()))
				st.Summary += ": " + f.Title
			} else if tail, err := lifecycle.Tail(logPath, 1); err == nil && len(tail) > 0 {
				field(agent.TextField("last_line", "last line", tail[0]))
			}
		}
		s.statusIncident(ctx, field, st, &rec, procs)
		return st, nil
	}
	st.Metrics["up"] = 1
	var problems []string
	problems = append(problems, s.statusInFlight(field, &rec)...)
	if changes := s.identityChanges(&rec); len(changes) > 0 {
		var attrs []string
		for _, c := range changes {
			attrs = append(attrs, c.Attr)
		}
		problems = append(problems, "drift: restart of "+strings.Join(attrs, ", "))
	}
	ready := "being stopped by an apply in flight"
	if rec.StoppingSince.IsZero() {
		ready = s.notReady(ctx, lc, &rec)
	}
	if ready == "" {
		field(agent.BoolField("ready", "readiness", true).WithText("ready"))
		st.Metrics["ready"] = 1
	} else {
		field(agent.BoolField("ready", "readiness", false).WithText("not ready: " + ready))
		problems = append(problems, "not ready")
	}
	logFields(field, m, st.Metrics)
	if s.enableMetrics && s.port > 0 {
		if pm, err := lc.Metrics(ctx, s.port); err != nil {
			field(agent.TextField("metrics_error", "/metrics", "unavailable: "+err.Error()))
		} else {
			servingFields(field, "metrics_", "/metrics ", pm, nil)
		}
	}
	if s.smoke != nil && ready == "" && !env.Probe {
		// The smoke test loads the server (a completion of up to max_tokens): it runs
		// after a launch and on `agent status --smoke`, and status otherwise shows the
		// launch's verdict.
		problems = append(problems, s.launchSmokeVerdict(field, st.Metrics, &rec)...)
	}
	if s.smoke != nil && ready == "" && env.Probe {
		r, err := lifecycle.RunSmoke(ctx, nil, lc.Place.Endpoint(s.port), *s.smoke)
		switch {
		case err != nil:
			field(agent.TextField("smoke_test", "smoke test", "no answer").WithText("no answer: " + err.Error()))
			problems = append(problems, "smoke test got no answer")
		case r.OK:
			field(agent.TextField("smoke_test", "smoke test", "passed").WithText(fmt.Sprintf("passed (repetition %.2f)", r.Repetition)))
			st.Metrics["smoke_test_passed"] = 1
		default:
			field(agent.TextField("smoke_test", "smoke test", "failed").WithText("failed: " + r.Reason))
			field(agent.TextField("smoke_output", "smoke output", r.Output).WithText(strconv.Quote(r.Output)))
			problems = append(problems, "smoke test failed ("+r.Reason+"); the server is left running: a bad answer is a sampling problem, not a server fault")
		}
	}
	if len(problems) > 0 {
		st.Healthy = false
		st.Summary = fmt.Sprintf("degraded, generation %d running: %s", rec.Generation, strings.Join(problems, "; "))
		return st, nil
	}
	st.Summary = fmt.Sprintf("running, ready, generation %d", rec.Generation)
	return st, nil
}

// servingMetrics are the serving figures status shows: one table for the status lines
// (from this generation's log, and again from /metrics when it is on) and for the numbers
// agent run exports (agent_server_<key>).
var servingMetrics = []struct {
	label, key, format string
	get                func(*engines.Metrics) *float64
	// field is the status field's key where key ("" for counters not exported) is not it.
	field string
}{
	{"accept len", "accept_length", "%.2f", func(m *engines.Metrics) *float64 { return m.AcceptLen }, ""},
	{"accept rate", "accept_rate", "%.2f", func(m *engines.Metrics) *float64 { return m.AcceptRate }, ""},
	{"gen throughput", "gen_throughput_tokens_per_second", "%.2f token/s", func(m *engines.Metrics) *float64 { return m.GenThroughput }, ""},
	{"token usage", "token_usage", "%.2f", func(m *engines.Metrics) *float64 { return m.TokenUsage }, ""},
	{"mamba usage", "mamba_usage", "%.2f", func(m *engines.Metrics) *float64 { return m.MambaUsage }, ""},
	// Counters only /metrics has.
	{"prompt tokens", "", "%.0f", func(m *engines.Metrics) *float64 { return m.PromptTokens }, "prompt_tokens"},
	{"generation tokens", "", "%.0f", func(m *engines.Metrics) *float64 { return m.GenerationTokens }, "generation_tokens"},
	{"requests", "", "%.0f", func(m *engines.Metrics) *float64 { return m.Requests }, "requests"},
}

// servingFields adds a status line per figure m has, keys prefixed with keyPrefix and
// labels with prefix, and the figures with a key to metrics when metrics is not nil.
func servingFields(field func(agent.Field), keyPrefix, prefix string, m engines.Metrics, metrics map[string]float64) {
	for _, sm := range servingMetrics {
		v := sm.get(&m)
		if v == nil {
			continue
		}
		key := sm.key
		if sm.field != "" {
			key = sm.field
		}
		field(agent.NumberField(keyPrefix+key, prefix+sm.label, *v).WithText(fmt.Sprintf(sm.format, *v)))
		if metrics != nil && sm.key != "" {
			metrics[sm.key] = *v
		}
	}
}

// logFields adds the log's serving figures, its queue and the time of its newest batch line.
func logFields(field func(agent.Field), m engines.Metrics, metrics map[string]float64) {
	servingFields(field, "", "", m, metrics)
	if m.RunningReqs != nil {
		q := 0
		if m.QueueReqs != nil {
			q = *m.QueueReqs
		}
		field(agent.NumberField("requests_running", "requests", *m.RunningReqs).WithText(fmt.Sprintf("%d running, %d queued", *m.RunningReqs, q)))
	}
	if !m.LastEvent.IsZero() {
		field(agent.TimeField("newest_batch_line_at", "newest batch line", m.LastEvent))
	}
}
