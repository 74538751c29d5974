package lifecycle

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

// The launched environment is the declared one: BaseEnv from the agent and nothing
// else of its own, the declared variables over it, sorted, the marker last.
func TestSpecEnviron(t *testing.T) {
	for k, v := range map[string]string{"PATH": "/agent/bin", "HOME": "/root", "LANG": "C.UTF-8", "LC_ALL": "C", "TZ": "UTC"} {
		t.Setenv(k, v)
	}
	t.Setenv("HF_TOKEN", "hf_agents_own") // not in BaseEnv: never inherited
	s := Spec{Env: map[string]string{"LANG": "en_US.UTF-8", "CUDA_VISIBLE_DEVICES": "0,1"}, Marker: "AGENT_SERVER=server.qwen#3"}
	want := []string{"CUDA_VISIBLE_DEVICES=0,1", "HOME=/root", "LANG=en_US.UTF-8", "LC_ALL=C", "PATH=/agent/bin", "TZ=UTC", "AGENT_SERVER=server.qwen#3"}
	if diff := cmp.Diff(want, s.Environ()); diff != "" {
		t.Errorf("Environ (-want +got):\n%s", diff)
	}
}
