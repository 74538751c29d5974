package daemon

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agent-dev/agent/internal/testbin"
	"github.com/agent-dev/agent/resources"
	"github.com/agent-dev/agent/resources/registry"
)

// gpuFaultPlan runs one fake SGLang on GPU 0 and one on GPU 1 (CUDA_VISIBLE_DEVICES).
const gpuFaultPlan = `
variable "fake" {}
variable "root" {}
variable "port" { type = number }
variable "port2" { type = number }
server "gpu0" {
  command = [var.fake]
  flags   = { "model-path" = "${var.root}/model", "port" = var.port }
  env     = { CUDA_VISIBLE_DEVICES = "0", HOME = var.root }
  ready {
    http    = "/health"
    timeout = "30s"
    settle  = "1s"
  }
  stop { timeout = "2s" }
  log_dir = "${var.root}/logs0"
}
server "gpu1" {
  command = [var.fake]
  flags   = { "model-path" = "${var.root}/model", "port" = var.port2 }
  env     = { CUDA_VISIBLE_DEVICES = "1", HOME = var.root }
  ready {
    http    = "/health"
    timeout = "30s"
    settle  = "1s"
  }
  stop { timeout = "2s" }
  log_dir = "${var.root}/logs1"
}
`

// gpuHostRoot is a fake host root (AGENT_HOST_ROOT) with two GPUs at 0000:01:00.0 and
// 0000:41:00.0 as the driver's procfs shows them, a boot id, and a dev/kmsg the test
// appends kernel log records to.
func gpuHostRoot(t *testing.T) (root string, kmsg func(seq int, msg string)) {
	t.Helper()
	root = t.TempDir()
	btime := time.Now().Add(-time.Hour).Unix()
	files := map[string]string{
		"proc/driver/nvidia/version":     "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.95.05  Tue Sep 23 09:55:41 UTC 2025\n",
		"proc/sys/kernel/random/boot_id": "2f6c0f4e-5d7a-4c41-9d0b-1a3e5b7c9d11\n",
		"proc/stat":                      "cpu  1 2 3 4\nbtime " + strconv.FormatInt(btime, 10) + "\n",
		"dev/kmsg":                       "6,1,1000,-;Linux version 6.1.0\n",
		"proc/driver/nvidia/gpus/0000:01:00.0/information": "Model: \t\t NVIDIA H100\nGPU UUID: \t GPU-aaaa0000-0000-0000-0000-000000000000\nBus Location: \t 0000:01:00.0\nDevice Minor: \t 0\n",
		"proc/driver/nvidia/gpus/0000:41:00.0/information": "Model: \t\t NVIDIA H100\nGPU UUID: \t GPU-bbbb0000-0000-0000-0000-000000000000\nBus Location: \t 0000:41:00.0\nDevice Minor: \t 1\n",
	}
	for name, data := range files {
		p := filepath.Join(root, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root, func(seq int, msg string) {
		f, err := os.OpenFile(filepath.Join(root, "dev", "kmsg"), os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		// the record's clock: the time since boot, now
		usec := time.Since(time.Unix(btime, 0)).Microseconds()
		if _, err := f.WriteString("4," + strconv.Itoa(seq) + "," + strconv.FormatInt(usec, 10) + ",-;" + msg + "\n"); err != nil {
			t.Fatal(err)
		}
	}
}

type faultRecord struct {
	PID        int       `json:"pid"`
	Generation int       `json:"generation"`
	VerifiedAt time.Time `json:"verified_at"`
	GPUFault   *struct {
		Xid        int    `json:"xid"`
		Line       string `json:"line"`
		Generation int    `json:"generation"`
		Action     string `json:"action"`
	} `json:"gpu_fault"`
}

func readFault(t *testing.T, stateDir, name string) faultRecord {
	t.Helper()
	var r faultRecord
	if b, err := os.ReadFile(filepath.Join(stateDir, "resources", "server."+name+".json")); err == nil {
		json.Unmarshal(b, &r)
	}
	return r
}

// Issue 37: under agent run, with a fake SGLang on GPU 0 and another on GPU 1, an Xid for
// a PCI id the host has no GPU at acts on nothing; an Xid 43 naming GPU 0's server
// relaunches only that server, within 5 s, with the line quoted in the log, the record and
// status; an Xid 79 on GPU 1 relaunches its server once and then holds it (no relaunch
// storm over 60 s, even when it dies) with "reboot required" in status.
func TestGPUFaultsUnderAgentRun(t *testing.T) {
	t.Parallel()
	hostRoot, kmsg := gpuHostRoot(t)
	fake, root := fakeRoot(t)
	vars := []string{"fake=" + fake, "root=" + root, "port=" + strconv.Itoa(testbin.FreePort(t)), "port2=" + strconv.Itoa(testbin.FreePort(t))}
	stateDir := ""
	base, logs := runReal(t, gpuFaultPlan, vars, func(c *Config) {
		stateDir = c.StateDir
		c.Interval = 2 * time.Second
		c.Kinds = registry.KindsFor(resources.HostFromEnv(func(string) string { return hostRoot }))
	})
	waitLong(t, "both servers verified", 90*time.Second, func() bool {
		a, b := readFault(t, stateDir, "gpu0"), readFault(t, stateDir, "gpu1")
		return a.Generation == 1 && !a.VerifiedAt.IsZero() && b.Generation == 1 && !b.VerifiedAt.IsZero()
	})
	g0, g1 := readFault(t, stateDir, "gpu0"), readFault(t, stateDir, "gpu1")

	// An Xid on a bus id this host has no GPU at: reported, nothing done.
	kmsg(10, "NVRM: Xid (PCI:0000:c1:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.")
	waitFor(t, "the unknown bus id reported", func() bool {
		return strings.Contains(logs.String(), "no GPU at: reported, nothing done")
	})
	time.Sleep(3 * time.Second)
	if a, b := readFault(t, stateDir, "gpu0"), readFault(t, stateDir, "gpu1"); a.Generation != 1 || b.Generation != 1 {
		t.Fatalf("an Xid on an unknown PCI id relaunched something: generations %d, %d", a.Generation, b.Generation)
	}

	// Xid 43 naming GPU 0's server: only it is relaunched, within 5 s.
	line43 := "NVRM: Xid (PCI:0000:01:00): 43, pid=" + strconv.Itoa(g0.PID) + ", name=python3, Ch 00000010"
	kmsg(11, line43)
	at := time.Now()
	waitLong(t, "GPU 0's server relaunched", 30*time.Second, func() bool {
		return readFault(t, stateDir, "gpu0").Generation == 2
	})
	if took := time.Since(at); took > 5*time.Second {
		t.Errorf("GPU 0's server was relaunched %s after the Xid, want within 5 s", took)
	}
	if r := readFault(t, stateDir, "gpu0"); r.GPUFault == nil || r.GPUFault.Line != line43 || r.GPUFault.Xid != 43 || r.GPUFault.Generation != 1 {
		t.Errorf("GPU 0's record does not quote the Xid: %+v", r.GPUFault)
	}
	if b := readFault(t, stateDir, "gpu1"); b.Generation != 1 || b.PID != g1.PID {
		t.Errorf("GPU 1's server was touched by GPU 0's Xid: %+v", b)
	}
	if log := logs.String(); !strings.Contains(log, "Xid (PCI:0000:01:00): 43") || !strings.Contains(log, "gpu_fault") {
		t.Errorf("the log does not quote the Xid line and the reason:\n%s", log)
	}

	// Xid 79 on GPU 1: one relaunch, then held, even when its process dies.
	kmsg(12, "NVRM: Xid (PCI:0000:41:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.")
	waitLong(t, "GPU 1's server relaunched once", 30*time.Second, func() bool {
		r := readFault(t, stateDir, "gpu1")
		return r.Generation == 2 && !r.VerifiedAt.IsZero()
	})
	held := readFault(t, stateDir, "gpu1")
	if held.GPUFault == nil || held.GPUFault.Xid != 79 || held.GPUFault.Action != "reboot" {
		t.Errorf("GPU 1's record: %+v", held.GPUFault)
	}
	waitLong(t, "status says reboot required", 30*time.Second, func() bool {
		r := statusOf(t, base, "server.gpu1")
		return r.Status != nil && strings.Contains(r.Status.Summary, "reboot required: GPU 1 (0000:41:00.0) fell off the bus (Xid 79 at ")
	})
	// What a GPU gone does to its server: it dies. The crash path must not relaunch it.
	if err := syscall.Kill(-held.PID, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	metrics := getMetrics(t, base)
	for _, want := range []string{`agent_gpu_xid_total{gpu="0",xid="43"} 1`, `agent_gpu_xid_total{gpu="1",xid="79"} 1`,
		`agent_gpu_healthy{gpu="0"} 1`, `agent_gpu_healthy{gpu="1"} 0`, `agent_gpu_lost{gpu="1"} 1`, `agent_gpu_lost{gpu="0"} 0`} {
		if !strings.Contains(metrics, want+"\n") {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	if strings.Contains(metrics, `agent_gpu_ecc_uncorrectable_total`) {
		t.Error("ECC counts without NVML: they are not known here")
	}
	// No relaunch storm over 60 s (thirty resyncs of 2 s), sampled each second.
	for end := time.Now().Add(60 * time.Second); time.Now().Before(end); time.Sleep(time.Second) {
		if r := readFault(t, stateDir, "gpu1"); r.Generation != 2 {
			t.Fatalf("GPU 1's server was relaunched %d times after the Xid 79, want once (then held)", r.Generation-1)
		}
	}
	if r := statusOf(t, base, "server.gpu1"); r.Status == nil || !strings.HasPrefix(r.Status.Summary, "not running") ||
		!strings.Contains(r.Status.Summary, "reboot required: GPU 1 (0000:41:00.0) fell off the bus") {
		t.Errorf("status of the held server, dead: %+v", r.Status)
	}
	if a := readFault(t, stateDir, "gpu0"); a.Generation != 2 {
		t.Errorf("GPU 0's server moved with GPU 1's fault: generation %d", a.Generation)
	}
}

func getMetrics(t *testing.T, base string) string {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
