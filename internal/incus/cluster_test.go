package incus_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agent-dev/agent/internal/incus"
	"github.com/agent-dev/agent/internal/incus/incustest"
)

// onMember reports whether the member's own INCUS_DIR holds the container's files:
// where it really lives, as opposed to what the API says.
func onMember(m *incustest.Member, name string) bool {
	_, err := os.Stat(filepath.Join(m.Dir, "containers", name))
	return err == nil
}

// TestCluster: the harness's cluster has three online members; an instance created
// through the first member's socket with target m2 lives and runs on m2, exec reaches
// it through that same socket, and once stopped it moves to m1 and runs there.
func TestCluster(t *testing.T) {
	c := cluster.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	cl, err := c.Client.Cluster(ctx)
	if err != nil || !cl.Enabled || cl.ServerName != "m1" {
		t.Fatalf("GET /1.0/cluster through m1: %+v %v", cl, err)
	}
	ms, err := c.Client.ClusterMembers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, m := range ms {
		names = append(names, m.ServerName)
		if !m.Online() || !strings.HasPrefix(m.URL, "https://127.0.0.") {
			t.Errorf("member %+v: want online on a loopback address", m)
		}
	}
	slices.Sort(names)
	if !slices.Equal(names, incustest.MemberNames) {
		t.Fatalf("members %v, want %v", names, incustest.MemberNames)
	}
	if _, err := c.Client.ClusterMember(ctx, "m9"); !incus.IsNotFound(err) {
		t.Errorf("unknown member: %v, want a 404", err)
	}

	name := c.InstanceName(t)
	err = c.Client.CreateInstance(ctx, incus.InstancesPost{Name: name, Source: incus.InstanceSource{Alias: c.Image}, Target: "m2"})
	if err != nil {
		t.Fatalf("create on m2: %v\n%s", err, c.LogTail(20))
	}
	if err := c.Client.Start(ctx, name); err != nil {
		t.Fatalf("start: %v\n%s", err, c.LogTail(20))
	}
	inst, _, err := c.Client.GetInstance(ctx, name)
	if err != nil || inst.Location != "m2" || !inst.Running() {
		t.Fatalf("instance: location %q status %q, %v; want running on m2", inst.Location, inst.Status, err)
	}
	if !onMember(c.Member("m2"), name) || onMember(c.Member("m1"), name) {
		t.Fatalf("instance %s: its files are not (only) in m2's INCUS_DIR", name)
	}
	res, err := c.Client.Exec(ctx, name, incus.ExecRequest{Command: []string{"sh", "-c", "echo hello from $(hostname)"}})
	if err != nil || res.ExitCode != 0 || strings.TrimSpace(string(res.Stdout)) != "hello from "+name {
		t.Fatalf("exec through m1 into m2: %+v %v", res, err)
	}

	if err := c.Client.MoveInstance(ctx, name, "m1"); err == nil {
		t.Fatal("moving a running container succeeded; Incus should refuse it")
	}
	if err := c.Client.Stop(ctx, name, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := c.Client.MoveInstance(ctx, name, "m1"); err != nil {
		t.Fatalf("move to m1: %v\n%s", err, c.LogTail(20))
	}
	inst, _, err = c.Client.GetInstance(ctx, name)
	if err != nil || inst.Location != "m1" {
		t.Fatalf("after the move: location %q, %v; want m1", inst.Location, err)
	}
	if !onMember(c.Member("m1"), name) || onMember(c.Member("m2"), name) {
		t.Fatalf("instance %s: its files did not move from m2's INCUS_DIR to m1's", name)
	}
	if err := c.Client.Start(ctx, name); err != nil {
		t.Fatal(err)
	}
	res, err = c.Client.Exec(ctx, name, incus.ExecRequest{Command: []string{"cat", "/etc/hostname"}})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("exec on m1 after the move: %+v %v", res, err)
	}
}
