package download

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"

	"github.com/agent-dev/agent/agent"
)

// Facts is what a download's diff was decided from besides its changes: the manifest
// it wants (every file's name, size and hash, as one hash) and, from the Hub, the commit
// its revision resolved to, so that a saved plan refuses a branch that moved since it
// was made (agent.Fingerprinter).
func (d *Download) Facts(env *agent.Env, diff *agent.Diff) []agent.Fact {
	det, ok := diff.Detail.(*downloadDetail)
	if !ok {
		return nil
	}
	h := sha256.New()
	for _, f := range det.files {
		fmt.Fprintf(h, "%s\x00%d\x00%s\x00%s\n", f.Name, f.Size, f.SHA256, f.GitBlob)
	}
	facts := []agent.Fact{{Name: "manifest", Value: "sha256:" + hex.EncodeToString(h.Sum(nil))}}
	if det.listing != nil {
		facts = append(facts, agent.Fact{Name: "commit", Value: det.listing.Commit})
	}
	return facts
}
