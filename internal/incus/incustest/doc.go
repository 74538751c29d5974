// Package incustest runs a real, private Incus daemon for integration tests.
//
// Tests of the container resource need a real incusd: a fake would only
// repeat our own assumptions about the API. The daemon started here is
// private to the test binary: its INCUS_DIR is a fresh directory under /tmp
// (short, because unix socket paths are limited to about 108 bytes), it has
// a "dir" storage pool named "default", a default profile with a root disk
// and no network, and one image, a busybox root filesystem built from the
// host's static /bin/busybox (Debian package busybox-static) and imported
// under the alias "busybox". Its /sbin/init is a shell loop that exits on
// SIGPWR, so clean stops are fast and real.
//
// Startup takes a few seconds, so a test binary shares one daemon:
//
//	var incusd = incustest.NewShared()
//
//	func TestMain(m *testing.M) { os.Exit(incusd.Run(m)) }
//
//	func TestSomething(t *testing.T) {
//		d := incusd.Start(t)
//		name := d.InstanceName(t) // unique; deleted when the test ends
//		...
//	}
//
// Start (the function) starts a daemon of the test's own instead.
//
// NewSharedCluster forms a three-member Incus cluster the same way (m1, m2, m3 on
// 127.0.0.2, .3 and .4, one random high port, each with its own INCUS_DIR; see
// docs/containers.md for the recipe): about 25 s on a loaded machine, once per test
// binary. Cluster.Client is the first member's, the cluster API; Member.Stop and
// Cluster.Restart take a member offline and back.
//
// Requirements: root, and the packages of scripts/install-incus.sh (incus
// from bookworm-backports, busybox-static). Without them a test is skipped,
// except when CI=true, where it fails: a container test that skips in CI is
// a failure.
package incustest
