// Package savedplan is the file `agent plan -out FILE` writes and `agent apply FILE` and
// `agent show FILE` read (docs/json-output.md, "Saved plans"): the plan as it was printed
// for people and as its --json document, what it was loaded from (the plan's inputs and
// variables, as keyed digests), the options it was planned with, and each resource's
// fingerprint (agent.Fingerprint). It holds no secret in clear: sensitive values appear
// only as digests keyed by the state directory's key (state.Store.PlanKey), -var values
// of sensitive variables are not kept, and the file is written 0600.
package savedplan

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/zclconf/go-cty/cty"
	ctyjson "github.com/zclconf/go-cty/cty/json"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/atomicfile"
	"github.com/agent-dev/agent/plans"
)

// Format names the file's kind in its "format" field; Version is the version of its
// layout this agent writes and reads. A new field keeps the version; a field that changes
// meaning or disappears bumps it, and an agent refuses a version it does not know.
const (
	Format  = "agent-saved-plan"
	Version = 1
)

// MaxSize bounds what Read reads: a saved plan is its diff and a few digests per
// resource.
const MaxSize = 64 << 20

// File is a saved plan.
type File struct {
	Format  string `json:"format"`
	Version int    `json:"version"`
	// ID is 32 random hex digits; the state directory records the ids applied.
	ID        string    `json:"id"`
	CreatedAt time.Time `json:"created_at"`
	// AgentVersion is the agent that saved it (cli.Version).
	AgentVersion string `json:"agent_version"`
	// Host is the hostname it was planned on: it applies there only.
	Host string `json:"host"`
	// StateDir is the state directory it was planned against (absolute).
	StateDir string  `json:"state_dir"`
	Source   Source  `json:"source"`
	Options  Options `json:"options"`
	// Text is the plan as `agent plan` printed it for people (secrets redacted).
	Text string `json:"text"`
	// Document is the plan's --json document (docs/json-output.md), as printed.
	Document json.RawMessage `json:"document"`
	// Resources are the resources' fingerprints, in the plan's order (orphans first).
	Resources []Resource `json:"resources"`
}

// Source is what the plan was loaded from.
type Source struct {
	// Path is the plan (a file or a directory) as an absolute path.
	Path string `json:"path"`
	// VarFiles are the -var-file paths (absolute); Vars the -var assignments of variables
	// that are not sensitive (a sensitive one must be given again, or come from the
	// environment, and is checked by its digest).
	VarFiles []string `json:"var_files"`
	Vars     []string `json:"vars"`
	// Inputs maps every file the plan was loaded from (its files, its var files, what
	// file() read) to the digest of its content.
	Inputs map[string]string `json:"inputs"`
	// Variables maps each variable to the digest of its value.
	Variables map[string]string `json:"variables"`
}

// Options are the command-line options the plan was made with; apply uses them.
type Options struct {
	Targets        []string `json:"targets"`
	NoDestructive  bool     `json:"no_destructive"`
	AllowDeleteAll bool     `json:"allow_delete_all"`
	HostOverride   string   `json:"host_override"`
}

// Resource is one resource's fingerprint.
type Resource struct {
	Address     string            `json:"address"`
	Fingerprint agent.Fingerprint `json:"fingerprint"`
}

// NewID returns a fresh saved plan id.
func NewID() (string, error) {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return hex.EncodeToString(b), nil
}

// Describe returns p's sources as a saved plan keeps them: every input's content and
// every variable's value as a digest keyed by key, and of vars only those assignments
// whose variable is not sensitive.
func Describe(p *plans.Plan, path string, varFiles, vars []string, key []byte) (Source, error) {
	s := Source{Path: path, VarFiles: slices.Clone(varFiles), Vars: []string{}, Inputs: map[string]string{}, Variables: map[string]string{}}
	if s.VarFiles == nil {
		s.VarFiles = []string{}
	}
	for _, v := range vars {
		name, _, _ := strings.Cut(v, "=")
		if pv := p.Variables[strings.TrimSpace(name)]; pv != nil && !pv.Sensitive {
			s.Vars = append(s.Vars, v)
		}
	}
	for _, in := range p.Inputs {
		data, err := os.ReadFile(in)
		switch {
		case errors.Is(err, os.ErrNotExist):
			s.Inputs[in] = "(missing)"
		case err != nil:
			return s, fmt.Errorf("read %s: %w", in, err)
		default:
			s.Inputs[in] = agent.Digest(key, data)
		}
	}
	for name, v := range p.Variables {
		val, _ := v.Value.UnmarkDeep()
		data, err := ctyjson.Marshal(val, cty.DynamicPseudoType)
		if err != nil {
			return s, fmt.Errorf("variable %s: %w", name, err)
		}
		s.Variables[name] = agent.Digest(key, data)
	}
	return s, nil
}

// Differences says how the sources now differ from the saved ones, one phrase each:
// a plan file, a var file or a file() input edited, added or gone, a variable changed.
func (s Source) Differences(now Source) []string {
	var out []string
	for _, in := range names(s.Inputs, now.Inputs) {
		was, had := s.Inputs[in]
		is, has := now.Inputs[in]
		switch {
		case !has:
			out = append(out, in+" is no longer read")
		case !had:
			out = append(out, in+" is read now, and was not")
		case was != is:
			out = append(out, in+" changed")
		}
	}
	for _, v := range names(s.Variables, now.Variables) {
		was, had := s.Variables[v]
		is, has := now.Variables[v]
		switch {
		case !has:
			out = append(out, "variable "+v+" is no longer declared")
		case !had:
			out = append(out, "variable "+v+" is new")
		case was != is:
			out = append(out, "variable "+v+" has another value (give it as the plan did: -var, -var-file or AGENT_VAR_"+v+")")
		}
	}
	return out
}

// names are the keys of a and b, sorted, once each.
func names(a, b map[string]string) []string {
	k := append(slices.Collect(maps.Keys(a)), slices.Collect(maps.Keys(b))...)
	slices.Sort(k)
	return slices.Compact(k)
}

// Fingerprints are the file's fingerprints by address.
func (f *File) Fingerprints() map[string]agent.Fingerprint {
	m := make(map[string]agent.Fingerprint, len(f.Resources))
	for _, r := range f.Resources {
		m[r.Address] = r.Fingerprint
	}
	return m
}

// Write writes f to path atomically (a temporary file beside it, fsynced, renamed),
// mode 0600.
func Write(path string, f *File) error {
	data, err := json.MarshalIndent(f, "", "  ")
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(path, append(data, '\n'), 0o600); err != nil {
		return fmt.Errorf("write the saved plan %s: %w", path, err)
	}
	return nil
}

// CanWrite says whether Write may write path: a new file, or a saved plan it replaces;
// never a plan file (a slip of `-out plan.hcl plan.hcl` would lose it), nor anything else
// that exists.
func CanWrite(path string) error {
	if strings.HasSuffix(path, ".hcl") {
		return fmt.Errorf("-out %s: a saved plan is not a plan file (*.hcl): name it like %s", path, strings.TrimSuffix(path, ".hcl")+".plan")
	}
	if _, err := os.Lstat(path); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if !Sniff(path) {
		return fmt.Errorf("-out %s: it exists and is not a saved plan; it is not overwritten: choose another name, or remove it", path)
	}
	return nil
}

// Sniff reports whether the file at path looks like a saved plan (a JSON object naming
// its format) rather than a plan file: how `agent apply ARG` tells them apart.
func Sniff(path string) bool {
	fd, err := os.Open(path)
	if err != nil {
		return false
	}
	defer fd.Close()
	if st, err := fd.Stat(); err != nil || !st.Mode().IsRegular() {
		return false
	}
	head := make([]byte, 512)
	n, _ := io.ReadFull(fd, head)
	head = bytes.TrimLeft(head[:n], " \t\r\n")
	return bytes.HasPrefix(head, []byte("{")) && bytes.Contains(head, []byte(`"`+Format+`"`))
}

// Read reads a saved plan, refusing a file that is not one or is of a version this agent
// does not know.
func Read(path string) (*File, error) {
	fd, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer fd.Close()
	data, err := io.ReadAll(io.LimitReader(fd, MaxSize+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if len(data) > MaxSize {
		return nil, fmt.Errorf("%s is over %d MiB: not a saved plan", path, MaxSize>>20)
	}
	var head struct {
		Format  string `json:"format"`
		Version int    `json:"version"`
	}
	if err := json.Unmarshal(data, &head); err != nil || head.Format != Format {
		return nil, fmt.Errorf("%s is not a saved plan (agent plan -out FILE writes one)", path)
	}
	if head.Version != Version {
		return nil, fmt.Errorf("%s is a saved plan of format version %d, and this agent reads version %d: apply it with the agent that saved it, or make it again with this one", path, head.Version, Version)
	}
	var f File
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("%s: corrupt saved plan: %w", path, err)
	}
	if len(f.ID) != 32 || len(f.Document) == 0 {
		return nil, fmt.Errorf("%s: corrupt saved plan: no id or no document", path)
	}
	return &f, nil
}
