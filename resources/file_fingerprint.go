package resources

import (
	"crypto/sha256"
	"encoding/hex"

	"github.com/agent-dev/agent/agent"
)

// Facts is what a file's diff was decided from besides its changes: the content found,
// as a hash (a digest only when the content is sensitive), so that a saved plan refuses
// a file edited by hand since it was made, and says so (agent.Fingerprinter).
func (f *File) Facts(env *agent.Env, d *agent.Diff) []agent.Fact {
	det, ok := d.Detail.(*fileDetail)
	if !ok || det.seen == "" {
		return nil
	}
	return []agent.Fact{{Name: "content hash", Value: det.seen, Sensitive: f.sensitive}}
}

func contentHash(b []byte) string {
	h := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(h[:])
}
