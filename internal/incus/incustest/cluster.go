package incustest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/agent-dev/agent/internal/incus"
)

// MemberNames are the names of the cluster's members, in order; the first one formed
// the cluster and imported the image.
var MemberNames = []string{"m1", "m2", "m3"}

// memberHosts are the loopback addresses the members listen on (all of 127/8 is the
// loopback interface on Linux): one address each, so every member can use the same
// port as Incus' default layout would.
var memberHosts = []string{"127.0.0.2", "127.0.0.3", "127.0.0.4"}

// clusterStartTimeout bounds forming the whole cluster on a loaded machine.
const clusterStartTimeout = 4 * time.Minute

// Cluster is a private three-member Incus cluster on this host: three incusd, each with
// its own INCUS_DIR under one directory, listening on 127.0.0.2, .3 and .4 (one random
// high port for all, so that clusters of concurrent test runs do not collide). The
// first member formed it; the others joined with a token. It has a "dir" pool named
// "default" on every member, a default profile with a root disk and no network, and
// the busybox image.
type Cluster struct {
	Members          []*Member
	Client           *incus.Client // the first member's: the cluster API
	Socket           string        // the first member's socket
	Image            string        // ImageAlias
	ImageFingerprint string

	dir    string
	incusd string
}

// Member is one member of a Cluster: a Daemon with its cluster name and address.
type Member struct {
	*Daemon
	Name    string // m1, m2, m3
	Address string // its core.https_address, 127.0.0.N:PORT
}

// SharedCluster is one cluster shared by the tests of a test binary, formed by the
// first test that needs it and torn down by Run (or Done) after all tests.
type SharedCluster struct {
	once sync.Once
	c    *Cluster
	skip string
	err  error
}

// NewSharedCluster returns a SharedCluster that has not started yet.
func NewSharedCluster() *SharedCluster { return &SharedCluster{} }

// Start returns the shared cluster, forming it on first use: skipped without incusd
// (or root, or a static busybox), a failure when CI=true, as Shared.Start.
func (s *SharedCluster) Start(t testing.TB) *Cluster {
	t.Helper()
	s.once.Do(func() { s.c, s.skip, s.err = startCluster() })
	if s.skip != "" {
		skipOrFail(t, s.skip)
	}
	if s.err != nil {
		t.Fatalf("incustest: cluster: %v", s.err)
	}
	return s.c
}

// Run runs the tests and then tears the cluster down if one was formed. Call it from
// TestMain: os.Exit(cluster.Run(m)).
func (s *SharedCluster) Run(m *testing.M) int { return s.Done(m.Run()) }

// Done tears the cluster down, if one was formed, and returns code, or 1 when the
// teardown failed. With a Shared daemon too: os.Exit(cluster.Done(incusd.Run(m))).
func (s *SharedCluster) Done(code int) int {
	if s.c != nil {
		if err := s.c.Close(); err != nil {
			fmt.Fprintf(os.Stderr, "incustest: %v\n", err)
			if code == 0 {
				code = 1
			}
		}
	}
	return code
}

// Member returns the member named name.
func (c *Cluster) Member(name string) *Member {
	for _, m := range c.Members {
		if m.Name == name {
			return m
		}
	}
	panic("incustest: no cluster member " + name)
}

// InstanceName returns a unique instance name, deleted through the cluster API when the
// test ends (see Daemon.InstanceName).
func (c *Cluster) InstanceName(t testing.TB) string {
	t.Helper()
	return c.Members[0].InstanceName(t)
}

// LogTail returns the last n lines of every member's log.
func (c *Cluster) LogTail(n int) string {
	var b bytes.Buffer
	for _, m := range c.Members {
		fmt.Fprintf(&b, "--- %s: %s\n", m.Name, m.LogTail(n))
	}
	return b.String()
}

// startCluster forms the cluster. A non-empty skip says why the host cannot run one.
func startCluster() (c *Cluster, skip string, err error) {
	incusd, image, skip, err := prerequisites()
	if skip != "" || err != nil {
		return nil, skip, err
	}
	dir, err := stateDir("incusc-")
	if err != nil {
		return nil, "", err
	}
	c = &Cluster{Image: ImageAlias, dir: dir, incusd: incusd}
	ctx, cancel := context.WithTimeout(context.Background(), clusterStartTimeout)
	defer cancel()
	if err := c.form(ctx, image); err != nil {
		return nil, "", errors.Join(err, c.Close())
	}
	return c, "", nil
}

// form starts the three daemons at once, bootstraps the first, imports the image and
// joins the others one by one (a join changes the database's membership: Incus
// serialises them anyway).
func (c *Cluster) form(ctx context.Context, image []byte) error {
	for _, name := range MemberNames {
		mdir := filepath.Join(c.dir, name)
		if err := os.Mkdir(mdir, 0o711); err != nil {
			return err
		}
		d, err := spawn(c.incusd, mdir)
		if err != nil {
			return err
		}
		c.Members = append(c.Members, &Member{Daemon: d, Name: name})
	}
	for _, m := range c.Members {
		if err := m.waitReady(ctx); err != nil {
			return fmt.Errorf("member %s: %w", m.Name, err)
		}
	}
	first := c.Members[0]
	c.Client, c.Socket = first.Client, first.Socket

	port, err := c.listen(ctx, first, 0)
	if err != nil {
		return err
	}
	cl := first.Client
	if err := defaultStorage(ctx, cl); err != nil {
		return err
	}
	if err := cl.EnableCluster(ctx, first.Name); err != nil {
		return fmt.Errorf("%w\n%s", err, first.LogTail(20))
	}
	// The fastest the cluster may call a silent member offline (Incus' minimum is 11 s,
	// its default 20 s): tests that stop a member wait for it.
	if err := cl.Query(ctx, "PATCH", "/1.0", map[string]any{"config": map[string]string{"cluster.offline_threshold": "11"}}, nil); err != nil {
		return fmt.Errorf("set cluster.offline_threshold: %w", err)
	}
	fp, err := cl.ImportImage(ctx, bytes.NewReader(image), nil, ImageAlias)
	if err != nil {
		return fmt.Errorf("import busybox image: %w\n%s", err, first.LogTail(20))
	}
	c.ImageFingerprint, first.Image, first.ImageFingerprint = fp, ImageAlias, fp

	var env struct {
		Environment struct {
			Certificate string `json:"certificate"`
		} `json:"environment"`
	}
	if err := cl.Query(ctx, "GET", "/1.0", nil, &env); err != nil {
		return err
	}
	for _, m := range c.Members[1:] {
		if _, err := c.listen(ctx, m, port); err != nil {
			return err
		}
		tok, err := cl.AddMember(ctx, m.Name)
		if err != nil {
			return err
		}
		// A "dir" pool's source is per member; empty lets each make its own under its
		// INCUS_DIR.
		mc := []incus.MemberConfigKey{{Entity: "storage-pool", Name: "default", Key: "source", Value: ""}}
		if err := m.Client.JoinCluster(ctx, tok, m.Address, env.Environment.Certificate, mc); err != nil {
			return fmt.Errorf("%w\n%s", err, m.LogTail(20))
		}
		m.Image, m.ImageFingerprint = ImageAlias, fp
	}
	return c.WaitMembers(ctx, incus.MemberOnline, MemberNames...)
}

// listen sets the member's core.https_address on its loopback address. With port 0 it
// picks a random high port free on all members' addresses, and tries another when
// the daemon cannot bind it (a concurrent test run took it in between).
func (c *Cluster) listen(ctx context.Context, m *Member, port int) (int, error) {
	host := memberHosts[slices.Index(MemberNames, m.Name)]
	var last error
	for attempt := 0; attempt < 8; attempt++ {
		p := port
		if p == 0 {
			p = 20000 + rand.IntN(40000)
			if !portFree(p) {
				continue
			}
		}
		addr := net.JoinHostPort(host, strconv.Itoa(p))
		last = m.Client.Query(ctx, "PATCH", "/1.0", map[string]any{"config": map[string]string{"core.https_address": addr}}, nil)
		if last == nil {
			m.Address = addr
			return p, nil
		}
		if port != 0 {
			break
		}
	}
	return 0, fmt.Errorf("member %s: set core.https_address: %w", m.Name, last)
}

// portFree reports whether port can be bound on every member address.
func portFree(port int) bool {
	for _, h := range memberHosts {
		l, err := net.Listen("tcp", net.JoinHostPort(h, strconv.Itoa(port)))
		if err != nil {
			return false
		}
		l.Close()
	}
	return true
}

// WaitMembers waits until the cluster (asked through the first member) reports every
// named member with status want (incus.MemberOnline, incus.MemberOffline).
func (c *Cluster) WaitMembers(ctx context.Context, want string, names ...string) error {
	var last string
	for {
		ms, err := c.Client.ClusterMembers(ctx)
		if err == nil {
			ok := true
			last = ""
			for _, n := range names {
				found := false
				for _, m := range ms {
					if m.ServerName == n {
						found = true
						if m.Status != want {
							ok = false
							last += m.Describe() + "; "
						}
					}
				}
				if !found {
					ok = false
					last += "member " + n + " is not in the cluster; "
				}
			}
			if ok {
				return nil
			}
		} else {
			last = err.Error()
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("members %v not %s: %w (last: %s)", names, want, ctx.Err(), last)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// Stop shuts the member's daemon down (its instances stop with it) and keeps its
// directory, so Restart can bring it back; the cluster sees it offline once its
// heartbeats are missed (cluster.offline_threshold, 11 s here).
func (m *Member) Stop() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd == nil {
		return nil
	}
	return m.stop()
}

// Freeze stops the member's incusd with SIGSTOP: a hung daemon, alive to the kernel
// (its sockets accept connections) but answering nothing; the cluster marks it Offline
// once its heartbeats are missed. thaw sends SIGCONT.
func (m *Member) Freeze() (thaw func() error, err error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cmd == nil || m.cmd.Process == nil {
		return nil, fmt.Errorf("member %s is not running", m.Name)
	}
	p := m.cmd.Process
	if err := p.Signal(syscall.SIGSTOP); err != nil {
		return nil, err
	}
	return func() error { return p.Signal(syscall.SIGCONT) }, nil
}

// Hang freezes the named member (Freeze) and waits until the cluster reports it Offline
// (about 11 s). thaw sends SIGCONT and waits until the cluster reports it Online again;
// the test's cleanup does so too, when the test has not (also when it fails), so the
// member is back for the next test.
func (c *Cluster) Hang(t testing.TB, name string) (thaw func()) {
	t.Helper()
	thaw = c.Freeze(t, name)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if err := c.WaitMembers(ctx, incus.MemberOffline, name); err != nil {
		t.Fatal(err)
	}
	return thaw
}

// Freeze is Hang without the wait: it returns as soon as the member's incusd is
// stopped, while the cluster still reports it Online (until its heartbeats are missed),
// the window in which a call forwarded to it hangs.
func (c *Cluster) Freeze(t testing.TB, name string) (thaw func()) {
	t.Helper()
	raw, err := c.Member(name).Freeze()
	if err != nil {
		t.Fatal(err)
	}
	var once sync.Once
	thaw = func() {
		once.Do(func() {
			if err := raw(); err != nil {
				t.Errorf("thaw %s: %v", name, err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			if err := c.WaitMembers(ctx, incus.MemberOnline, name); err != nil {
				t.Errorf("%s back: %v", name, err)
			}
		})
	}
	t.Cleanup(thaw)
	return thaw
}

// Restart starts a stopped member's daemon again on its directory and waits until the
// cluster reports it online.
func (c *Cluster) Restart(ctx context.Context, m *Member) error {
	if !m.closed() {
		return fmt.Errorf("member %s is running", m.Name)
	}
	d, err := spawn(c.incusd, m.Dir)
	if err != nil {
		return err
	}
	d.Image, d.ImageFingerprint = m.Image, m.ImageFingerprint
	m.Daemon = d
	if err := m.waitReady(ctx); err != nil {
		return fmt.Errorf("member %s: %w", m.Name, err)
	}
	if err := c.WaitMembers(ctx, incus.MemberOnline, m.Name); err != nil {
		return err
	}
	return c.waitForwarding(ctx, m.Name)
}

// waitForwarding waits until the first member forwards requests to the member again:
// online by heartbeat comes a little before the instances on it can be read through the
// cluster ("Server isn't ready yet" meanwhile).
func (c *Cluster) waitForwarding(ctx context.Context, member string) error {
	var last error
	for {
		last = c.Client.Query(ctx, "GET", "/1.0/resources?target="+member, nil, nil)
		if last == nil {
			var list []incus.Instance
			last = c.Client.Query(ctx, "GET", "/1.0/instances?recursion=1", nil, &list)
			for _, inst := range list {
				if last == nil && inst.Location == member {
					_, _, last = c.Client.GetInstance(ctx, inst.Name)
				}
			}
			if last == nil {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("member %s: requests are not forwarded to it: %w (last: %v)", member, ctx.Err(), last)
		case <-time.After(250 * time.Millisecond):
		}
	}
}

// Close deletes every instance through the cluster API, shuts all members down at
// once (one by one, the last would wait for a database quorum that left), unmounts
// what they left mounted and removes the directory. It is safe to call more than once.
func (c *Cluster) Close() error {
	if c.dir == "" {
		return nil
	}
	var errs []error
	ctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	if len(c.Members) > 0 && !c.Members[0].closed() && c.Client != nil {
		errs = c.Members[0].removeInstances(ctx)
	}
	var wg sync.WaitGroup
	for _, m := range c.Members {
		wg.Add(1)
		go func() { defer wg.Done(); _ = m.Stop() }()
	}
	wg.Wait()
	if err := unmountUnder(c.dir); err != nil {
		errs = append(errs, err)
	}
	if err := os.RemoveAll(c.dir); err != nil {
		errs = append(errs, fmt.Errorf("remove %s: %w", c.dir, err))
	}
	c.dir = ""
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("tear down the incus cluster: %w", err)
	}
	return nil
}

// Running reports whether the member's daemon runs (not stopped by Stop).
func (m *Member) Running() bool { return !m.closed() }
