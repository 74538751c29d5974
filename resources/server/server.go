// Package server is the `server` resource kind: a model server (SGLang, vLLM, llama.cpp)
// launched, verified, watched and relaunched on the host or in a container, one file per
// phase (bind, observe, decide, apply, status) and per feature (revert, liveness,
// migrate, delete). It implements resources.Servers and resources.GPUServerStopper.
package server

import (
	"slices"
	"syscall"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/zclconf/go-cty/cty"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/lifecycle"
	"github.com/agent-dev/agent/internal/proc"
	"github.com/agent-dev/agent/internal/state"
	"github.com/agent-dev/agent/plans"
	"github.com/agent-dev/agent/resources"
)

// ServerConfig is the `server` block.
type ServerConfig struct {
	Container      *string               `hcl:"container,optional"`
	Command        []string              `hcl:"command"`
	Flags          cty.Value             `hcl:"flags,optional"`
	Args           []string              `hcl:"args,optional"`
	Env            map[string]string     `hcl:"env,optional"`
	Workdir        *string               `hcl:"workdir,optional"`
	Home           *string               `hcl:"home,optional"`
	User           *string               `hcl:"user,optional"`
	Port           *int                  `hcl:"port,optional"`
	Ready          *ServerReadyConfig    `hcl:"ready,block"`
	Stop           *ServerStopConfig     `hcl:"stop,block"`
	SmokeTest      *ServerSmokeConfig    `hcl:"smoke_test,block"`
	Liveness       *ServerLivenessConfig `hcl:"liveness,block"`
	Warm           *ServerWarmConfig     `hcl:"warm,block"`
	Takeover       *bool                 `hcl:"takeover,optional"`
	LogDir         *string               `hcl:"log_dir,optional"`
	KeepLogs       *int                  `hcl:"keep_logs,optional"`
	UnhealthyGrace *string               `hcl:"unhealthy_grace,optional"`
	Preflight      *string               `hcl:"preflight,optional"`
	Ensure         *string               `hcl:"ensure,optional"`
	Revert         *bool                 `hcl:"revert,optional"` // default true: server_revert.go // "present" (default) or "absent": server_delete.go
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

// ServerLivenessConfig is the `liveness` block of a server (server_liveness.go).
type ServerLivenessConfig struct {
	HTTP     *string `hcl:"http,optional"`
	Interval *string `hcl:"interval,optional"`
	Timeout  *string `hcl:"timeout,optional"`
	Failures *int    `hcl:"failures,optional"`
	Enabled  *bool   `hcl:"enabled,optional"`
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
	addr, name         string
	host               resources.Machine
	container          string          // the Incus instance it runs in; "" on the host
	place              string          // "host" or "container NAME": part of the identity
	retiringPlace      string          // in a view (liveView): the place of the instance a migration retires
	incus              resources.Incus // the plan's Incus socket and its clients, shared by runs and views
	command            []string
	flags              []serverFlag
	args               []string
	env                map[string]string
	workdir, user      string
	home               string // as declared; "" for the default (serverHome)
	port               int
	ready              lifecycle.Ready
	stopSignal         syscall.Signal
	stopTimeout        time.Duration
	smoke              *lifecycle.Smoke
	takeover           bool
	logDir             string
	keepLogs           int
	grace              time.Duration
	enableMetrics      bool
	preflightMode      string                // "warn", "enforce" or "off": does the model fit the GPUs? (preflight.go)
	envSensitive       func(key string) bool // env[key] derives from a sensitive variable (plans.Resource.SensitiveKey)
	flagsSensitive     func(key string) bool // flags[key] does
	argvSensitive      bool                  // some flag does: the rendered command line holds a secret
	noRevert           bool                  // revert = false: a failed change is not rolled back (server_revert.go)
	liveness           livenessPlan          // the liveness block, or the engine's default (server_liveness.go)
	warm               warmPlan              // the warm block: weights read ahead of a launch (warm.go)
	resources.Deletion                       // ensure = "absent", agent destroy, an orphan: server_delete.go
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
func ServerKind(h resources.Machine) agent.Kind {
	k := agent.NewKind("server", func(r *plans.Resource, c *ServerConfig) (agent.Resource, hcl.Diagnostics) {
		return bindServer(h, r, c)
	})
	k.Orphan = func(addr string, st *state.Scoped, a *plans.AgentSettings) (agent.Resource, error) {
		return orphanServer(h, addr, st, a)
	}
	k.Guarded = true
	return k
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
	var revert time.Duration // a failed change's revert: a second launch
	if s.revertOn() {
		revert = s.ready.Timeout + s.ready.Settle + lifecycle.DefaultSmokeTimeout
	}
	return revert + s.warmTimeout() + s.stopTimeout + proc.DefaultKillWait + lifecycle.PortWait + lifecycle.GPUWait +
		s.ready.Timeout + s.ready.Settle + lifecycle.DefaultSmokeTimeout + time.Minute
}
