package server

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/proc"
	"github.com/agent-dev/agent/resources"
	"github.com/agent-dev/agent/resources/restest"
)

// faultHost is a fake host root with two GPUs (0000:01:00.0, 0000:41:00.0), a boot id and
// a kernel log to append to; boot changes the boot id, as a reboot does.
func faultHost(t *testing.T) (root string, xid func(seq int, msg string), boot func(id string)) {
	t.Helper()
	root = t.TempDir()
	btime := time.Now().Add(-time.Hour).Unix()
	write := func(name, data string) {
		p := filepath.Join(root, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("proc/driver/nvidia/version", "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.95.05  Tue Sep 23 09:55:41 UTC 2025\n")
	write("proc/driver/nvidia/gpus/0000:01:00.0/information", "Model: \t\t NVIDIA H100\nGPU UUID: \t GPU-a\nBus Location: \t 0000:01:00.0\nDevice Minor: \t 0\n")
	write("proc/driver/nvidia/gpus/0000:41:00.0/information", "Model: \t\t NVIDIA H100\nGPU UUID: \t GPU-b\nBus Location: \t 0000:41:00.0\nDevice Minor: \t 1\n")
	write("proc/stat", "btime "+strconv.FormatInt(btime, 10)+"\n")
	write("proc/sys/kernel/random/boot_id", "boot-1\n")
	write("dev/kmsg", "")
	return root, func(seq int, msg string) {
			f, err := os.OpenFile(filepath.Join(root, "dev", "kmsg"), os.O_APPEND|os.O_WRONLY, 0)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			usec := time.Since(time.Unix(btime, 0)).Microseconds()
			f.WriteString("4," + strconv.Itoa(seq) + "," + strconv.FormatInt(usec, 10) + ",-;" + msg + "\n")
		}, func(id string) {
			write("proc/sys/kernel/random/boot_id", id+"\n")
		}
}

// A GPU fallen off the bus: the server on it is relaunched once; an agent that restarts
// (a fresh memory, the kernel log read again from its start) keeps it held, even dead,
// because its record names the fault and the boot; a reboot (a new boot id) clears the
// judgement and the server is launched again.
func TestServerGPUFaultSurvivesARestartAndClearsOnReboot(t *testing.T) {
	t.Parallel()
	h := newSrvHarness(t)
	host, xid, boot := faultHost(t)
	m := resources.HostFromEnv(func(string) string { return host })
	plan := strings.Replace(srvPlan, `FAKE_SGLANG_DECODE_INTERVAL = "100ms" }`, `FAKE_SGLANG_DECODE_INTERVAL = "100ms", CUDA_VISIBLE_DEVICES = "1" }`, 1)
	vars := []string{"fake=" + fakeSGLang(t), "logs=" + h.logs(), "port=" + strconv.Itoa(h.port)}
	ctx := context.Background()
	engine := func(mem *agent.Memory) *agent.Engine {
		return restest.Engine(t, h.dir, plan, kindsFor(m), h.store, agent.Options{Memory: mem, Loop: true}, vars...)
	}
	poll := func(mem *agent.Memory) { // what the server's watch does under agent run
		env := &agent.Env{Memory: mem, Now: time.Now, Log: slog.New(slog.DiscardHandler)}
		f := resources.FaultsOf(env, m)
		f.Poll(ctx, env)
	}
	mem1 := agent.NewMemory()
	mustOK(t, engine(mem1).Apply(ctx, nil).Steps[0])

	xid(1, "NVRM: Xid (PCI:0000:41:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.")
	poll(mem1)
	st := engine(mem1).Apply(ctx, nil).Steps[0]
	mustOK(t, st)
	if r := h.record(); r.Generation != 2 || r.GPUFault == nil || r.GPUFault.Action.String() != "reboot" || r.GPUFault.Boot != "boot-1" {
		t.Fatalf("after the Xid 79: generation %d, %+v", r.Generation, r.GPUFault)
	}

	// The agent restarts; then the GPU's server dies.
	mem2 := agent.NewMemory()
	poll(mem2)
	r := h.record()
	if _, err := (proc.FS{}).Stop(ctx, r.target(), syscall.SIGKILL, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	st = engine(mem2).Apply(ctx, nil).Steps[0]
	if st.Err != nil || st.Diff.Action != agent.NoOp || len(st.Diff.Warnings) == 0 ||
		!strings.HasPrefix(st.Diff.Warnings[0], "reboot required: GPU 1 (0000:41:00.0) fell off the bus (Xid 79 at ") {
		t.Fatalf("after a restart, the held server: %v %+v", st.Err, st.Diff)
	}
	if r := h.record(); r.Generation != 2 {
		t.Fatalf("relaunched after the restart: generation %d", r.Generation)
	}

	// The host reboots (a new boot id; the kernel log of this test stays, as a file).
	boot("boot-2")
	time.Sleep(resources.FaultPoll + 100*time.Millisecond)
	poll(mem2)
	st = engine(mem2).Apply(ctx, nil).Steps[0]
	mustOK(t, st)
	if r := h.record(); r.Generation != 3 || len(st.Diff.Changes) == 0 || st.Diff.Changes[0].Reason != agent.ReasonGone {
		t.Fatalf("after the reboot: generation %d, %+v; want the server launched again as any gone server is", r.Generation, st.Diff.Changes)
	}
}
