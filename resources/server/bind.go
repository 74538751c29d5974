package server

import (
	"fmt"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"github.com/hashicorp/hcl/v2"
	"github.com/zclconf/go-cty/cty"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/cmdline"
	"github.com/agent-dev/agent/internal/lifecycle"
	"github.com/agent-dev/agent/plans"
	"github.com/agent-dev/agent/resources"
)

var signals = map[string]syscall.Signal{
	"SIGTERM": syscall.SIGTERM, "SIGINT": syscall.SIGINT, "SIGQUIT": syscall.SIGQUIT,
	"SIGHUP": syscall.SIGHUP, "SIGKILL": syscall.SIGKILL, "SIGUSR1": syscall.SIGUSR1, "SIGUSR2": syscall.SIGUSR2,
}

// bindServer checks a server block beyond its types and returns the Server: its
// command and place, its paths, and its ready, stop and smoke_test blocks.
func bindServer(h resources.Machine, r *plans.Resource, c *ServerConfig) (agent.Resource, hcl.Diagnostics) {
	b := &resources.Binder{R: r}
	s := &Server{
		addr: r.Addr, name: r.Name, host: h, command: c.Command, args: c.Args, env: c.Env, incus: resources.NewIncus(r.Agent),
		workdir: defaultWorkdir, user: resources.Deref(c.User), takeover: resources.Deref(c.Takeover),
		logDir: DefaultServerLogDir, keepLogs: DefaultKeepLogs, grace: DefaultUnhealthyGrace,
		ready:      lifecycle.Ready{Timeout: DefaultReadyTimeout, Settle: DefaultSettle},
		stopSignal: syscall.SIGTERM, stopTimeout: DefaultStopTimeout,
		envSensitive:   func(k string) bool { return r.SensitiveKey("env", k) },
		flagsSensitive: func(k string) bool { return r.SensitiveKey("flags", k) },
		argvSensitive:  r.SensitiveAny("flags"),
	}
	s.bindCommand(b, c)
	s.bindPaths(b, c)
	s.grace = b.Duration(c.UnhealthyGrace, DefaultUnhealthyGrace, "unhealthy_grace")
	s.noRevert = c.Revert != nil && !*c.Revert
	s.bindEnsure(r, c.Ensure, b.Bad)
	switch p := resources.Deref(c.Preflight); p {
	case "", "warn":
		s.preflightMode = "warn"
	case "enforce", "off":
		s.preflightMode = p
	default:
		b.Bad(r.Range("preflight"), "Invalid preflight", fmt.Sprintf("preflight is \"warn\" (the default), \"enforce\" or \"off\", not %q.", p))
	}
	s.bindReady(b, c.Ready)
	s.bindStop(b, c.Stop)
	s.bindSmoke(b, c.SmokeTest)
	s.bindLiveness(b, c.Liveness)
	s.bindWarm(b, c.Warm)
	if b.Diags.HasErrors() {
		return nil, b.Diags
	}
	return s, nil
}

// bindCommand reads the place (the host, or a container), the command, its flags and the
// port (port, or flags["port"]; both must agree).
func (s *Server) bindCommand(b *resources.Binder, c *ServerConfig) {
	r := b.R
	s.place = lifecycle.Local{}.Name()
	if c.Container != nil {
		s.container = *c.Container
		s.place = lifecycle.IncusPlace(s.container)
		if !resources.ValidInstanceName(s.container) {
			b.Bad(r.Range("container"), "Invalid container", fmt.Sprintf("container = %q is not an Incus instance name (letters, digits and dashes, starting with a letter); write container = container.NAME.name.", s.container))
		}
	}
	if len(c.Command) == 0 || c.Command[0] == "" {
		b.Bad(r.Range("command"), "Empty command", `command is the program and its first arguments, e.g. ["python3", "-m", "sglang.launch_server"].`)
	}
	flagPort := 0
	if c.Flags != cty.NilVal && !c.Flags.IsNull() {
		fl, port, msg := renderFlags(c.Flags)
		if msg != "" {
			b.Bad(r.Range("flags"), "Invalid flags", msg)
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
		b.Bad(r.Range("port"), "Invalid port", fmt.Sprintf("port %d is not a TCP port (1-65535).", *c.Port))
	case c.Port != nil && flagPort != 0 && *c.Port != flagPort:
		b.Bad(r.Range("port"), "Port differs from flags", fmt.Sprintf("port = %d but flags[\"port\"] = %d: the agent would watch one port while the server listens on the other.", *c.Port, flagPort))
	case c.Port != nil:
		s.port = *c.Port
	default:
		s.port = flagPort
	}
}

// bindPaths reads workdir, home, log_dir and keep_logs.
func (s *Server) bindPaths(b *resources.Binder, c *ServerConfig) {
	r := b.R
	if c.Workdir != nil {
		s.workdir = *c.Workdir
		if !filepath.IsAbs(s.workdir) {
			b.Bad(r.Range("workdir"), "Relative workdir", "workdir must be an absolute path.")
		}
	}
	if c.Home != nil {
		s.home = *c.Home
		if !filepath.IsAbs(s.home) {
			b.Bad(r.Range("home"), "Relative home", "home must be an absolute path.")
		}
	}
	if c.LogDir != nil {
		s.logDir = *c.LogDir
		if !filepath.IsAbs(s.logDir) {
			b.Bad(r.Range("log_dir"), "Relative log_dir", "log_dir must be an absolute path.")
		} else if resources.HasDotDot(s.logDir) {
			b.Bad(r.Range("log_dir"), "log_dir with ..", fmt.Sprintf("log_dir %q has a \"..\" element; write the directory it means (%s).", s.logDir, filepath.Clean(s.logDir)))
		}
	}
	if c.KeepLogs != nil {
		s.keepLogs = *c.KeepLogs
		if s.keepLogs < 1 {
			b.Bad(r.Range("keep_logs"), "Invalid keep_logs", "keep_logs counts the current generation's log, so it is at least 1.")
		}
	}
}

// bindReady reads the ready block: an HTTP path on the port, or a log line.
func (s *Server) bindReady(b *resources.Binder, c *ServerReadyConfig) {
	if c == nil {
		return
	}
	r := b.R
	s.ready.HTTP = resources.Deref(c.HTTP)
	s.ready.LogLine = resources.Deref(c.LogLine)
	s.ready.Timeout = b.Duration(c.Timeout, DefaultReadyTimeout, "ready", "timeout")
	s.ready.Settle = settleDuration(c.Settle, b.BadValue, r.Range("ready", "settle"))
	if s.ready.HTTP != "" && !strings.HasPrefix(s.ready.HTTP, "/") {
		b.Bad(r.Range("ready", "http"), "Invalid ready.http", "ready.http is a path on the server's port, such as \"/health\".")
	}
	if s.ready.HTTP != "" && s.port == 0 {
		b.Bad(r.Range("ready", "http"), "No port", "ready.http needs the server's port: set port (or flags[\"port\"]).")
	}
}

// bindStop reads the stop block: the signal and how long to wait for it.
func (s *Server) bindStop(b *resources.Binder, c *ServerStopConfig) {
	if c == nil {
		return
	}
	s.stopTimeout = b.Duration(c.Timeout, DefaultStopTimeout, "stop", "timeout")
	if c.Signal == nil {
		return
	}
	name := strings.ToUpper(*c.Signal)
	if !strings.HasPrefix(name, "SIG") {
		name = "SIG" + name
	}
	sig, ok := signals[name]
	if !ok {
		b.Bad(b.R.Range("stop", "signal"), "Unknown signal", fmt.Sprintf("stop.signal %q is not one of SIGTERM, SIGINT, SIGQUIT, SIGHUP, SIGKILL, SIGUSR1, SIGUSR2.", *c.Signal))
	}
	s.stopSignal = sig
}

// bindSmoke reads the smoke_test block; the server's api-key flag, if any, is its key.
func (s *Server) bindSmoke(b *resources.Binder, c *ServerSmokeConfig) {
	if c == nil {
		return
	}
	r := b.R
	sm := &lifecycle.Smoke{Prompt: c.Prompt, MaxTokens: 512, Expect: resources.Deref(c.Expect), MaxRepetition: -1}
	if c.MaxTokens != nil {
		sm.MaxTokens = *c.MaxTokens
	}
	if p := c.MaxRepetition; p != nil {
		if *p < 0 || *p > 1 {
			b.Bad(r.Range("smoke_test", "max_repetition"), "Invalid max_repetition", "max_repetition is a share of the output, between 0 and 1.")
		}
		sm.MaxRepetition = *p
	}
	if v := c.Sampling; v != cty.NilVal && !v.IsNull() {
		m, msg := sampling(v)
		if msg != "" {
			b.Bad(r.Range("smoke_test", "sampling"), "Invalid sampling", msg)
		}
		sm.Sampling = m
	}
	for _, f := range s.flags {
		if f.name == "api-key" && len(f.argv) == 2 {
			sm.APIKey = f.argv[1]
		}
	}
	if s.port == 0 {
		b.Bad(r.Range("smoke_test"), "No port", "smoke_test needs the server's port: set port (or flags[\"port\"]).")
	}
	s.smoke = sm
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
