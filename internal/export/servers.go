package export

import (
	"bufio"
	"bytes"
	"math/big"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/agent-dev/agent/internal/cmdline"
	"github.com/agent-dev/agent/internal/lifecycle"
	"github.com/agent-dev/agent/internal/proc"
)

// Engines export recognises.
const (
	EngineSGLang   = "sglang"
	EngineVLLM     = "vllm"
	EngineLlamaCPP = "llama.cpp"
)

// Server is a running model server.
type Server struct {
	Engine     string    `json:"engine"`
	PID        int       `json:"pid"`
	StartTicks uint64    `json:"start_ticks"`
	Started    time.Time `json:"started,omitzero"`
	// Container is the Incus instance the process runs in; "" on the host.
	Container string   `json:"container,omitempty"`
	Argv      []string `json:"argv"`
	// Command is the program and its leading arguments (up to the first flag).
	Command []string `json:"command"`
	// Flags are the parsed flags: strings, numbers (float64) and true for bare flags.
	Flags map[string]any `json:"flags"`
	// Canonical reports whether command + Flags, rendered the way the server resource
	// renders them (sorted by name), gives Argv back exactly. When false the plan keeps
	// the argv verbatim in command, so that the running process still matches it.
	Canonical bool `json:"canonical"`
	// FlagsProblem says why the flags cannot be a map (when Canonical is false).
	FlagsProblem string            `json:"flags_problem,omitempty"`
	Env          map[string]string `json:"env"`
	// Dropped are environment keys left out: secrets (by name), and the shell's session.
	DroppedSecrets []string `json:"dropped_secrets"`
	DroppedSession []string `json:"dropped_session"`
	Workdir        string   `json:"workdir"`
	Port           int      `json:"port,omitempty"`
	PortFrom       string   `json:"port_from,omitempty"` // "flag" or "socket"
	// Log is where the process's stdout goes (/proc/PID/fd/1).
	Log string `json:"log,omitempty"`
	// ModelPath is the weights directory the server loads, as the process sees it.
	ModelPath string `json:"model_path,omitempty"`
	// HostModelPath is ModelPath on the host, for a server in a container whose disk
	// device maps it.
	HostModelPath string `json:"host_model_path,omitempty"`
}

// recognise says whether argv launches a model server, and where its flags start.
//
// A console script (`sglang serve`, `vllm serve`) started through its shebang shows in
// /proc as the interpreter followed by the script's path ("/usr/bin/python3
// /usr/local/bin/sglang serve …"), so the script is recognised behind a python too.
func recognise(argv []string) (engine string, flagsAt int) {
	if len(argv) == 0 {
		return "", 0
	}
	base := path.Base(argv[0])
	module := func() (string, int) {
		for i := 1; i+1 < len(argv); i++ {
			if argv[i] == "-m" {
				return argv[i+1], i + 2
			}
			if !strings.HasPrefix(argv[i], "-") {
				return "", 0
			}
		}
		return "", 0
	}
	leading := func(from int) int { // the positional arguments after the program
		for from < len(argv) && !strings.HasPrefix(argv[from], "-") {
			from++
		}
		return from
	}
	serve := len(argv) > 1 && argv[1] == "serve"
	switch {
	case strings.HasPrefix(base, "python"):
		switch m, at := module(); m {
		case "sglang.launch_server":
			return EngineSGLang, at
		case "vllm.entrypoints.openai.api_server":
			return EngineVLLM, at
		}
		if len(argv) > 1 && strings.HasPrefix(argv[1], "/") {
			if e, at := recognise(argv[1:]); e != "" {
				return e, at + 1
			}
		}
	case base == "sglang" && serve, base == "fake-sglang" && serve:
		// `sglang serve [MODEL] --flags`: SGLang's recommended entry point.
		return EngineSGLang, leading(2)
	case base == "fake-sglang":
		return EngineSGLang, leading(1)
	case base == "vllm" && serve:
		return EngineVLLM, leading(2)
	case base == "llama-server":
		return EngineLlamaCPP, 1
	}
	return "", 0
}

// servePositional is the MODEL of `sglang serve MODEL` or `vllm serve MODEL`: the
// positional argument after "serve" in command, or "".
func servePositional(command []string) string {
	for i, w := range command {
		if w == "serve" && i+1 < len(command) && i > 0 {
			b := path.Base(command[i-1])
			if b == "sglang" || b == "vllm" || b == "fake-sglang" {
				return command[i+1]
			}
		}
	}
	return ""
}

// parseFlags reads `--k v`, `--k=v` and bare `--k` (true). It returns the map and
// whether rendering it the server resource's way (sorted, `--k v`, bare for true)
// after command gives argv back exactly; problem says why not.
func parseFlags(argv []string, at int) (flags map[string]any, canonical bool, problem string) {
	flags = map[string]any{}
	rest := argv[at:]
	for i := 0; i < len(rest); i++ {
		tok := rest[i]
		if !strings.HasPrefix(tok, "--") || tok == "--" {
			return flags, false, "argument " + strconv.Quote(tok) + " is not a --flag"
		}
		name, val, hasEq := strings.Cut(tok[2:], "=")
		if _, dup := flags[name]; dup {
			return flags, false, "--" + name + " is given twice"
		}
		switch {
		case hasEq:
			flags[name] = value(val)
		case i+1 < len(rest) && isValue(rest[i+1]):
			flags[name] = value(rest[i+1])
			i++
		default:
			flags[name] = true
		}
	}
	if got, err := cmdline.Render(argv[:at], flags); err != nil || !slices.Equal(got, argv) {
		return flags, false, "the flags are not in the order the agent renders them (sorted by name, --name value)"
	}
	return flags, true, ""
}

// isValue reports whether a token after a --flag is its value: anything but another
// flag (a negative number is a value).
func isValue(tok string) bool {
	if !strings.HasPrefix(tok, "-") {
		return true
	}
	_, err := strconv.ParseFloat(tok, 64)
	return err == nil
}

// value is a flag value: a number when the server resource would render it back to
// the same text, else the string.
func value(s string) any {
	f, ok := new(big.Float).SetPrec(512).SetString(s)
	if !ok || cmdline.Number(f) != s {
		return s
	}
	x, _ := f.Float64()
	return x
}

// secretKey matches environment names whose values are secrets.
var secretKey = regexp.MustCompile(`(?i)TOKEN|SECRET|KEY|PASSWORD|AUTH`)

// sessionKeys are environment entries of the shell a server was started from, not of
// the server: they would pin a login session into the plan.
var sessionKeys = map[string]bool{
	"_": true, "PWD": true, "OLDPWD": true, "SHLVL": true, "TERM": true, "COLORTERM": true,
	"LS_COLORS": true, "MAIL": true, "LOGNAME": true, "USER": true, "HOME": true, "SHELL": true,
	"HOSTNAME": true, "MOTD_SHOWN": true, "LESSOPEN": true, "LESSCLOSE": true, "DISPLAY": true,
	"INVOCATION_ID": true, "JOURNAL_STREAM": true, "STY": true, "WINDOW": true, "TMUX": true,
	"TMUX_PANE": true, "SSH_CLIENT": true, "SSH_CONNECTION": true, "SSH_TTY": true, "SSH_AUTH_SOCK": true,
	"DBUS_SESSION_BUS_ADDRESS": true, "XDG_RUNTIME_DIR": true, "XDG_SESSION_ID": true,
	"XDG_SESSION_TYPE": true, "XDG_SESSION_CLASS": true, "XDG_DATA_DIRS": true, "XDG_CONFIG_DIRS": true,
	"AGENT_SERVER": true,
	"AGENT_OWNER":  true,
}

// splitEnv keeps the server's environment, dropping secrets and session entries.
func splitEnv(environ []string) (env map[string]string, secrets, session []string) {
	env = map[string]string{}
	for _, kv := range environ {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			continue
		}
		switch {
		case jitDefault(environ, k, v):
			session = append(session, k)
		case secretKey.MatchString(k):
			secrets = append(secrets, k)
		case sessionKeys[k]:
			session = append(session, k)
		default:
			env[k] = v
		}
	}
	sort.Strings(secrets)
	sort.Strings(session)
	return env, secrets, session
}

// jitDefault says whether k=v is a JIT cache location the agent gives every launch by
// default (lifecycle.JITCacheEnv of the process's HOME): not the server's own setting,
// so a plan exported from an agent-launched server does not pin it as identity.
func jitDefault(environ []string, k, v string) bool {
	for _, kv := range environ {
		if home, ok := strings.CutPrefix(kv, "HOME="); ok {
			d, ok := lifecycle.JITCacheEnv(home)[k]
			return ok && d == v
		}
	}
	return false
}

// containerOf names the Incus instance a process runs in, from its cgroup
// ("0::/lxc.payload.NAME/…"); "" on the host.
var lxcPayload = regexp.MustCompile(`lxc\.payload\.([A-Za-z0-9-]+)`)

func containerOf(fs proc.FS, pid int) string {
	b, err := os.ReadFile(filepath.Join(procRoot(fs), strconv.Itoa(pid), "cgroup"))
	if err != nil {
		return ""
	}
	if m := lxcPayload.FindSubmatch(b); m != nil {
		return string(m[1])
	}
	return ""
}

func procRoot(fs proc.FS) string {
	if fs.Root == "" {
		return proc.DefaultRoot
	}
	return fs.Root
}

// observeServers scans the processes for model servers. Children that keep their
// parent's argv (SGLang's schedulers) are folded into the topmost one.
func observeServers(fs proc.FS, containers []Container, ports []int) ([]Server, []string, error) {
	all, err := fs.All()
	if err != nil {
		return nil, nil, err
	}
	argvs := map[int][]string{}
	var cands []proc.Stat
	for _, st := range all {
		if st.Dead() {
			continue
		}
		argv, err := fs.Cmdline(st.PID)
		if err != nil || len(argv) == 0 {
			continue
		}
		if e, _ := recognise(argv); e == "" {
			continue
		}
		argvs[st.PID] = argv
		cands = append(cands, st)
	}
	var out []Server
	var notes []string
	for _, st := range cands {
		argv := argvs[st.PID]
		if p, ok := argvs[st.PPID]; ok && slices.Equal(p, argv) {
			continue
		}
		engine, at := recognise(argv)
		s := Server{Engine: engine, PID: st.PID, StartTicks: st.StartTicks, Argv: argv,
			Container: containerOf(fs, st.PID)}
		if t, err := fs.StartTime(st.PID); err == nil {
			s.Started = t.UTC()
		}
		s.Flags, s.Canonical, s.FlagsProblem = parseFlags(argv, at)
		s.Command = slices.Clone(argv[:at])
		if env, err := fs.Environ(st.PID); err == nil {
			s.Env, s.DroppedSecrets, s.DroppedSession = splitEnv(env)
		} else {
			s.Env = map[string]string{}
			notes = append(notes, "server pid "+strconv.Itoa(st.PID)+": environment not readable: "+err.Error())
		}
		if cwd, err := fs.Cwd(st.PID); err == nil {
			s.Workdir = cwd
		}
		if p, ok := s.Flags["port"].(float64); ok {
			s.Port, s.PortFrom = int(p), "flag"
		} else if p := listeningPort(fs, all, st.PID); p > 0 {
			s.Port, s.PortFrom = p, "socket"
		}
		if l, err := os.Readlink(filepath.Join(procRoot(fs), strconv.Itoa(st.PID), "fd", "1")); err == nil {
			s.Log = l
		}
		for _, k := range []string{"model-path", "model"} {
			if v, ok := s.Flags[k].(string); ok {
				s.ModelPath = v
				break
			}
		}
		if s.ModelPath == "" {
			s.ModelPath = servePositional(s.Command) // sglang serve MODEL, vllm serve MODEL
		}
		if s.Container != "" && filepath.IsAbs(s.ModelPath) {
			s.HostModelPath = hostPath(containers, s.Container, s.ModelPath)
		}
		if len(ports) > 0 && !slices.Contains(ports, s.Port) {
			continue
		}
		out = append(out, s)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Port != out[j].Port {
			return out[i].Port < out[j].Port
		}
		return out[i].PID < out[j].PID
	})
	return out, notes, nil
}

// listeningPort finds a TCP port that pid (or a descendant) listens on, in the network
// namespace of pid: /proc/PID/net/tcp{,6} matched against its socket descriptors, so a
// server inside a container is seen too. 0 when none.
func listeningPort(fs proc.FS, all []proc.Stat, pid int) int {
	root := procRoot(fs)
	listening := map[string]int{} // "socket:[inode]" → port
	for _, name := range []string{"tcp", "tcp6"} {
		b, err := os.ReadFile(filepath.Join(root, strconv.Itoa(pid), "net", name))
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			f := strings.Fields(sc.Text())
			if len(f) < 10 || f[3] != "0A" {
				continue
			}
			_, hexPort, ok := strings.Cut(f[1], ":")
			if !ok {
				continue
			}
			p, err := strconv.ParseUint(hexPort, 16, 16)
			if err != nil {
				continue
			}
			listening["socket:["+f[9]+"]"] = int(p)
		}
	}
	pids := []int{pid}
	for _, d := range proc.Descendants(all, pid) {
		pids = append(pids, d.PID)
	}
	best := 0
	for _, p := range pids {
		dir := filepath.Join(root, strconv.Itoa(p), "fd")
		fds, err := os.ReadDir(dir)
		if err != nil {
			continue
		}
		for _, fd := range fds {
			link, err := os.Readlink(filepath.Join(dir, fd.Name()))
			if err != nil {
				continue
			}
			if port, ok := listening[link]; ok && (best == 0 || port < best) {
				best = port
			}
		}
	}
	return best
}

// hostPath maps a path inside a container to the host through its disk devices; ""
// when none maps it.
func hostPath(containers []Container, name, p string) string {
	for _, c := range containers {
		if c.Name != name {
			continue
		}
		best, bestLen := "", -1
		for _, d := range c.Devices {
			if d["type"] != "disk" || d["source"] == "" || !filepath.IsAbs(d["source"]) {
				continue
			}
			mp := filepath.Clean(d["path"])
			rel, err := filepath.Rel(mp, p)
			if err != nil || rel == ".." || strings.HasPrefix(rel, "../") || len(mp) <= bestLen {
				continue
			}
			best, bestLen = filepath.Join(d["source"], rel), len(mp)
		}
		return best
	}
	return ""
}
