package download

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/hashicorp/hcl/v2"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/bytesize"
	"github.com/agent-dev/agent/internal/fetch"
	"github.com/agent-dev/agent/internal/state"
	"github.com/agent-dev/agent/plans"
	"github.com/agent-dev/agent/resources"
)

// A download is deleted (ensure = "absent", agent destroy, an orphan) by removing exactly
// the files its manifest lists as verified, then what fetch keeps beside them (the
// lock, partial files and their sidecars: names a plan may not use, fetch.Own), then the
// manifest, then the directories that leaves empty, dest included. Anything else in dest
// (files the operator put there) stays, and the step warns that dest is kept with them:
// the manifest is the only proof of what the agent placed.

var _ agent.Ensurer = (*Download)(nil)

// AsAbsent is the download as agent destroy deletes it.
func (d *Download) AsAbsent() agent.Resource {
	return &Download{addr: d.addr, dest: d.dest, Deletion: resources.Deletion{Delete: true, Why: agent.ReasonDestroy}}
}

func (d *Download) bindEnsure(r *plans.Resource, ensure *string) hcl.Diagnostics {
	switch e := resources.Deref(ensure); e {
	case "", "present":
	case "absent":
		d.Deletion = resources.Deletion{Delete: true, Why: agent.ReasonEnsureAbsent}
	default:
		return hcl.Diagnostics{{Severity: hcl.DiagError, Summary: "Invalid ensure", Subject: r.Range("ensure").Ptr(),
			Detail: fmt.Sprintf("ensure is \"present\" or \"absent\", not %q.", e)}}
	}
	return nil
}

// orphanDownload deletes, from its record alone, what a download block that left the
// plan placed. A record without dest (an older agent's) cannot say where: nothing is
// deleted, and the step says so.
func orphanDownload(addr string, st *state.Scoped, _ *plans.AgentSettings) (agent.Resource, error) {
	var rec downloadRecord
	has, err := st.Load(&rec)
	if err != nil || !has {
		return nil, err
	}
	if rec.Dest == "" || !filepath.IsAbs(rec.Dest) {
		return resources.LeftAlone{Why: fmt.Sprintf("no longer in the plan, but its record (written by an older agent) does not say where its files are: left alone; delete them yourself, then %s.json in the state directory's resources/", addr)}, nil
	}
	return &Download{addr: addr, dest: rec.Dest, Deletion: resources.Deletion{Delete: true, Why: agent.ReasonOrphan, Orphan: true}}, nil
}

// downloadDelete is what checkAbsent found, for applyAbsent.
type downloadDelete struct {
	files  []string // relative to dest, present on disk
	own    []string // fetch's own files in dest (the lock, partials): removed too
	forget bool     // only the record is left
}

func (d *Download) checkAbsent(env *agent.Env) (*agent.Diff, error) {
	names, err := fetch.ManifestFiles(d.dest)
	if err != nil {
		return nil, fmt.Errorf("read the manifest in %s: %w", d.dest, err)
	}
	det := &downloadDelete{}
	diff := &agent.Diff{Detail: det}
	for _, n := range names {
		fi, err := os.Lstat(filepath.Join(d.dest, n))
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if err != nil {
			return nil, err
		}
		det.files = append(det.files, n)
		diff.Add(agent.Removed(fmt.Sprintf("file[%q]", n), agent.Raw(bytesize.Format(fi.Size()))).Because(agent.Deletes, d.Why))
	}
	if len(det.files) == 0 && len(names) > 0 {
		diff.Add(agent.Removed("manifest", agent.Raw(filepath.Join(d.dest, fetch.ManifestName))).Because(agent.Deletes, d.Why))
	}
	own, others, err := fetch.Contents(d.dest)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", d.dest, err)
	}
	listed := map[string]bool{}
	for _, n := range names {
		listed[n] = true
	}
	for _, n := range own {
		if n != fetch.ManifestName {
			det.own = append(det.own, n)
		}
	}
	if len(diff.Changes) == 0 && len(det.own) > 0 {
		diff.Add(agent.Removed("leftovers", agent.Raw(fmt.Sprintf("%d files the agent keeps while downloading (%s)", len(det.own), strings.Join(det.own, ", ")))).Because(agent.Deletes, d.Why))
	}
	var foreign []string
	for _, n := range others {
		if !listed[n] {
			foreign = append(foreign, n)
		}
	}
	if len(foreign) > 0 {
		shown := foreign[:min(len(foreign), 5)]
		more := ""
		if len(foreign) > len(shown) {
			more = fmt.Sprintf(" and %d more", len(foreign)-len(shown))
		}
		diff.Warnings = append(diff.Warnings, fmt.Sprintf("%s is kept: it holds %d files the agent did not place (%s%s); they are left as they are", d.dest, len(foreign), strings.Join(shown, ", "), more))
	}
	if len(diff.Changes) == 0 {
		has, err := env.State.Load(&downloadRecord{})
		if err != nil {
			return nil, err
		}
		if !has {
			return agent.NoChange(), nil
		}
		det.forget = true
		diff.Add(agent.Change{Attr: "record", Old: agent.Raw("no file of it is left in " + d.dest), HasOld: true, Effect: agent.Deletes, Reason: d.Why})
	}
	return diff.Derive(), nil
}

// applyAbsent removes the listed files through the destination's root (never through a
// symlink out of it), the manifest last, then the directories emptied, then the record.
func (d *Download) applyAbsent(env *agent.Env, diff *agent.Diff) error {
	det, ok := diff.Detail.(*downloadDelete)
	if !ok {
		return fmt.Errorf("internal error: diff detail is %T", diff.Detail)
	}
	if !det.forget {
		root, err := os.OpenRoot(d.dest)
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		if root != nil {
			defer root.Close()
			dirs := map[string]bool{}
			for _, n := range det.files {
				if err := root.Remove(n); err != nil && !errors.Is(err, fs.ErrNotExist) {
					return fmt.Errorf("remove %s: %w", filepath.Join(d.dest, n), err)
				}
				for dir := filepath.Dir(n); dir != "." && dir != "/"; dir = filepath.Dir(dir) {
					dirs[dir] = true
				}
			}
			for _, n := range det.own {
				if err := root.Remove(filepath.FromSlash(n)); err != nil && !errors.Is(err, fs.ErrNotExist) {
					return fmt.Errorf("remove %s: %w", filepath.Join(d.dest, n), err)
				}
				for dir := filepath.Dir(n); dir != "." && dir != "/"; dir = filepath.Dir(dir) {
					dirs[dir] = true
				}
			}
			if err := root.Remove(fetch.ManifestName); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return fmt.Errorf("remove the manifest: %w", err)
			}
			// Deepest first; a directory with anything else in it stays (Remove fails).
			var list []string
			for dir := range dirs {
				list = append(list, dir)
			}
			for len(list) > 0 {
				deepest := 0
				for i, dir := range list {
					if strings.Count(dir, "/") > strings.Count(list[deepest], "/") {
						deepest = i
					}
				}
				_ = root.Remove(list[deepest])
				list = append(list[:deepest], list[deepest+1:]...)
			}
			_ = os.Remove(d.dest) // only when empty
		}
		env.Log.Info("deleted the download's files", "dest", d.dest, "files", len(det.files), "reason", string(d.Why))
	}
	return env.State.Delete()
}

func (d *Download) absentStatus(env *agent.Env) (*agent.Status, error) {
	names, err := fetch.ManifestFiles(d.dest)
	if err != nil {
		return nil, err
	}
	if len(names) == 0 {
		return &agent.Status{Healthy: true, Summary: "absent: no file of it in " + d.dest}, nil
	}
	return &agent.Status{Healthy: false, Summary: fmt.Sprintf("%d files of it are in %s, but the plan says ensure = \"absent\": agent apply deletes them", len(names), d.dest)}, nil
}
