// Package etcdtest starts real etcd members (Debian's etcd-server, /usr/bin/etcd) on
// loopback for tests: one member or a three-member cluster, each of which a test can stop
// and start again. A missing etcd skips the test, and fails it when CI=true
// (scripts/install-etcd.sh installs it).
package etcdtest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/agent-dev/agent/internal/testbin"
)

// InstallHint is how to get the etcd the tests need.
const InstallHint = "sh scripts/install-etcd.sh (Debian's etcd-server)"

// Binary returns etcd's path, skipping the test without it (failing it when CI=true).
func Binary(tb testing.TB) string {
	tb.Helper()
	p, err := exec.LookPath("etcd")
	if err != nil {
		testbin.Missing(tb, "etcdtest: no etcd on PATH", "install with: "+InstallHint)
	}
	return p
}

// Cluster is a set of etcd members started for one test.
type Cluster struct {
	Members []*Member
	// TLS, when set, are the files a client needs (the members require client
	// certificates signed by CA).
	TLS *TLSFiles
	tb  testing.TB
}

// TLSFiles are a test CA and a client certificate it signed.
type TLSFiles struct {
	CA, Cert, Key string
}

// Member is one etcd process.
type Member struct {
	Name      string
	ClientURL string
	peerURL   string
	dataDir   string
	args      []string
	log       string
	cmd       *exec.Cmd
	exited    chan struct{}
}

// Options tune Start.
type Options struct {
	// TLS serves clients over TLS with client certificates.
	TLS bool
}

// Start starts n members (1 or 3) on loopback and waits until the cluster answers; they
// are killed at the test's end.
func Start(tb testing.TB, n int, opts Options) *Cluster {
	tb.Helper()
	bin := Binary(tb)
	dir := tb.TempDir()
	c := &Cluster{tb: tb}
	scheme := "http"
	var tlsArgs []string
	if opts.TLS {
		c.TLS = makeCerts(tb, dir)
		scheme = "https"
		tlsArgs = []string{"--cert-file", filepath.Join(dir, "server.pem"), "--key-file", filepath.Join(dir, "server-key.pem"),
			"--trusted-ca-file", c.TLS.CA, "--client-cert-auth"}
	}
	var initial []string
	for i := range n {
		m := &Member{Name: fmt.Sprintf("m%d", i),
			ClientURL: fmt.Sprintf("%s://127.0.0.1:%d", scheme, testbin.FreePort(tb)),
			peerURL:   fmt.Sprintf("http://127.0.0.1:%d", testbin.FreePort(tb))}
		c.Members = append(c.Members, m)
		initial = append(initial, m.Name+"="+m.peerURL)
	}
	for _, m := range c.Members {
		m.log = filepath.Join(dir, m.Name+".log")
		m.dataDir = filepath.Join(dir, m.Name)
		m.args = append([]string{bin,
			"--name", m.Name, "--data-dir", m.dataDir,
			"--listen-client-urls", m.ClientURL, "--advertise-client-urls", m.ClientURL,
			"--listen-peer-urls", m.peerURL, "--initial-advertise-peer-urls", m.peerURL,
			"--initial-cluster", strings.Join(initial, ","), "--initial-cluster-state", "new",
			"--initial-cluster-token", filepath.Base(dir),
			"--heartbeat-interval", "100", "--election-timeout", "1000",
			"--logger", "zap", "--log-outputs", "stderr", "--log-level", "warn"}, tlsArgs...)
		c.start(m)
	}
	tb.Cleanup(func() {
		for _, m := range c.Members {
			m.kill()
		}
	})
	c.WaitHealthy()
	return c
}

// Endpoints are the members' client URLs.
func (c *Cluster) Endpoints() []string {
	var out []string
	for _, m := range c.Members {
		out = append(out, m.ClientURL)
	}
	return out
}

func (c *Cluster) start(m *Member) {
	c.tb.Helper()
	f, err := os.OpenFile(m.log, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		c.tb.Fatal(err)
	}
	cmd := exec.Command(m.args[0], m.args[1:]...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		c.tb.Fatalf("etcdtest: start %s: %v", m.Name, err)
	}
	f.Close()
	m.cmd, m.exited = cmd, make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(m.exited)
	}()
}

// Stop kills member i (SIGKILL: an outage, not a graceful leave).
func (c *Cluster) Stop(i int) { c.Members[i].kill() }

// StopAll kills every member.
func (c *Cluster) StopAll() {
	for _, m := range c.Members {
		m.kill()
	}
}

// Restart starts member i again on its data directory.
func (c *Cluster) Restart(i int) {
	c.tb.Helper()
	m := c.Members[i]
	m.kill()
	c.start(m)
}

// RestartAll starts every stopped member again and waits until the cluster answers.
func (c *Cluster) RestartAll() {
	c.tb.Helper()
	for i, m := range c.Members {
		if m.cmd == nil {
			c.Restart(i)
		}
	}
	c.WaitHealthy()
}

// RestartAllEmpty kills every member, empties their data directories and starts them
// again as a new cluster (the same names and URLs): etcd lost its state, as a member on a
// tmpfs, a replaced one or a restore from an older snapshot does. It waits until the
// cluster answers.
func (c *Cluster) RestartAllEmpty() {
	c.tb.Helper()
	c.StopAll()
	for _, m := range c.Members {
		if err := os.RemoveAll(m.dataDir); err != nil {
			c.tb.Fatalf("etcdtest: emptying %s: %v", m.dataDir, err)
		}
	}
	for _, m := range c.Members {
		c.start(m)
	}
	c.WaitHealthy()
}

func (m *Member) kill() {
	if m.cmd == nil {
		return
	}
	_ = m.cmd.Process.Kill()
	<-m.exited
	m.cmd = nil
}

// WaitHealthy waits until every running member reports healthy (a leader is elected and
// it serves).
func (c *Cluster) WaitHealthy() {
	c.tb.Helper()
	hc := &http.Client{Timeout: time.Second}
	if c.TLS != nil {
		cfg, err := c.clientTLS()
		if err != nil {
			c.tb.Fatal(err)
		}
		hc.Transport = &http.Transport{TLSClientConfig: cfg}
	}
	deadline := time.Now().Add(60 * time.Second)
	for _, m := range c.Members {
		if m.cmd == nil {
			continue
		}
		for {
			resp, err := hc.Get(m.ClientURL + "/health")
			if err == nil {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if strings.Contains(string(b), `"health":"true"`) {
					break
				}
				err = fmt.Errorf("%s", b)
			}
			select {
			case <-m.exited:
				out, _ := os.ReadFile(m.log)
				c.tb.Fatalf("etcdtest: %s exited: %s", m.Name, tail(out))
			default:
			}
			if time.Now().After(deadline) {
				out, _ := os.ReadFile(m.log)
				c.tb.Fatalf("etcdtest: %s not healthy after 60 s (%v): %s", m.Name, err, tail(out))
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

func tail(b []byte) string {
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// makeCerts writes a CA, a server certificate for 127.0.0.1 and a client certificate.
func makeCerts(tb testing.TB, dir string) *TLSFiles {
	tb.Helper()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "agent test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		tb.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			tb.Fatal(err)
		}
		return p
	}
	issue := func(name string, serial int64, usage x509.ExtKeyUsage) {
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
			IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			tb.Fatal(err)
		}
		kb, _ := x509.MarshalECPrivateKey(key)
		write(name+".pem", "CERTIFICATE", der)
		write(name+"-key.pem", "EC PRIVATE KEY", kb)
	}
	issue("server", 2, x509.ExtKeyUsageServerAuth)
	issue("client", 3, x509.ExtKeyUsageClientAuth)
	return &TLSFiles{CA: write("ca.pem", "CERTIFICATE", caDER), Cert: filepath.Join(dir, "client.pem"), Key: filepath.Join(dir, "client-key.pem")}
}

func (c *Cluster) clientTLS() (*tls.Config, error) {
	cert, err := tls.LoadX509KeyPair(c.TLS.Cert, c.TLS.Key)
	if err != nil {
		return nil, err
	}
	pem, err := os.ReadFile(c.TLS.CA)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	return &tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: pool}, nil
}
