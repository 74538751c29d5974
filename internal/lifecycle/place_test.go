package lifecycle

import (
	"strings"
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
	want := []string{"CUDA_VISIBLE_DEVICES=0,1", "FLASHINFER_WORKSPACE_BASE=/root", "HOME=/root", "LANG=en_US.UTF-8", "LC_ALL=C", "PATH=/agent/bin",
		"TORCHINDUCTOR_CACHE_DIR=/root/.cache/torchinductor", "TRITON_CACHE_DIR=/root/.cache/triton", "TZ=UTC", "AGENT_SERVER=server.qwen#3"}
	if diff := cmp.Diff(want, s.Environ()); diff != "" {
		t.Errorf("Environ (-want +got):\n%s", diff)
	}
}

// JIT caches live under the server's HOME (a declared home moves them with it), never
// under /tmp; a declared cache location wins.
func TestJITCachesFollowHome(t *testing.T) {
	t.Setenv("HOME", "/root")
	s := Spec{Home: "/var/lib/agent/home", Env: map[string]string{"TRITON_CACHE_DIR": "/fast/triton"}}
	got := map[string]string{}
	for _, kv := range s.Environ() {
		k, v, _ := strings.Cut(kv, "=")
		got[k] = v
	}
	want := map[string]string{"TRITON_CACHE_DIR": "/fast/triton", "TORCHINDUCTOR_CACHE_DIR": "/var/lib/agent/home/.cache/torchinductor",
		"FLASHINFER_WORKSPACE_BASE": "/var/lib/agent/home", "HOME": "/var/lib/agent/home"}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %q, want %q", k, got[k], v)
		}
	}
	for k, v := range got {
		if strings.HasPrefix(v, "/tmp") {
			t.Errorf("%s = %q: a cache under /tmp does not survive a reboot", k, v)
		}
	}
}
