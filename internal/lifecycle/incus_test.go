package lifecycle

import (
	"strings"
	"testing"

	"github.com/agent-dev/agent/internal/incus"
)

func TestIncusEndpoint(t *testing.T) {
	t.Parallel()
	proxy := func(listen, connect string, extra ...string) map[string]string {
		d := map[string]string{"type": "proxy", "listen": listen, "connect": connect}
		for i := 0; i+1 < len(extra); i += 2 {
			d[extra[i]] = extra[i+1]
		}
		return d
	}
	eth0 := &incus.InstanceState{Network: map[string]incus.NetworkState{
		"lo":   {Addresses: []incus.NetworkAddress{{Family: "inet", Address: "127.0.0.1", Scope: "local"}}},
		"eth0": {Addresses: []incus.NetworkAddress{{Family: "inet6", Address: "fd42::5", Scope: "global"}, {Family: "inet", Address: "10.0.3.5", Scope: "global"}}},
	}}
	for _, tt := range []struct {
		name    string
		devices map[string]map[string]string
		state   *incus.InstanceState
		want    string
	}{
		{"proxy", map[string]map[string]string{"api": proxy("tcp:127.0.0.1:18000", "tcp:127.0.0.1:30000")}, nil, "127.0.0.1:18000"},
		{"proxy on any address", map[string]map[string]string{"api": proxy("tcp:0.0.0.0:18000", "tcp:0.0.0.0:30000")}, eth0, "127.0.0.1:18000"},
		{"ipv6 proxy", map[string]map[string]string{"api": proxy("tcp:[::1]:18000", "tcp:[::1]:30000")}, nil, "[::1]:18000"},
		{"other port, then the address", map[string]map[string]string{"api": proxy("tcp:127.0.0.1:18000", "tcp:127.0.0.1:8080")}, eth0, "10.0.3.5:30000"},
		{"bind = container is the other way", map[string]map[string]string{"api": proxy("tcp:127.0.0.1:18000", "tcp:127.0.0.1:30000", "bind", "container")}, nil, ""},
		{"udp", map[string]map[string]string{"api": proxy("udp:127.0.0.1:18000", "udp:127.0.0.1:30000")}, nil, ""},
		{"nothing", map[string]map[string]string{"root": {"type": "disk", "path": "/"}}, &incus.InstanceState{}, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := IncusEndpoint(&incus.Instance{Name: "c", ExpandedDevices: tt.devices}, tt.state, 30000)
			if got != tt.want || (tt.want == "") != (err != nil) {
				t.Errorf("IncusEndpoint = %q, %v; want %q", got, err, tt.want)
			}
			if err != nil && !strings.Contains(err.Error(), `connect = "tcp:127.0.0.1:30000"`) {
				t.Errorf("the error does not say how to add a proxy: %v", err)
			}
		})
	}
}

func TestIncusEnviron(t *testing.T) {
	t.Parallel()
	r := &Incus{}
	got := r.environ(Spec{Env: map[string]string{"B": "x y", "PATH": "/opt/bin"}, Marker: "AGENT_SERVER=s#1"}, "/root")
	want := "B=x y,HOME=/root,PATH=/opt/bin,AGENT_SERVER=s#1"
	if strings.Join(got, ",") != want {
		t.Errorf("environ = %q, want %q", got, want)
	}
}
