package plans

import (
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/hcl/v2"
)

func TestCoordination(t *testing.T) {
	t.Parallel()
	p, diags := load(t, `
variable "etcd" {
  default = ["https://etcd1:2379", "https://etcd2:2379", "https://etcd3:2379"]
}
agent {
  state_dir = "/var/lib/agent"
  coordination {
    etcd      = var.etcd
    ca_file   = "/etc/agent/etcd-ca.pem"
    cert_file = "tls/agent.pem"
    key_file  = "tls/agent-key.pem"
    prefix    = "/agent/prod/"
    lease     = "20s"
    name      = "kpro5"
    host_disruptions {
      max_unavailable = 2
      group           = "gpu-hosts"
    }
  }
}
`, Options{})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	c := p.Agent.Coordination
	if c == nil {
		t.Fatal("no coordination")
	}
	c.DeclRange = hcl.Range{}
	want := &Coordination{Etcd: []string{"https://etcd1:2379", "https://etcd2:2379", "https://etcd3:2379"},
		CAFile: "/etc/agent/etcd-ca.pem", CertFile: filepath.Join(p.Dir, "tls/agent.pem"), KeyFile: filepath.Join(p.Dir, "tls/agent-key.pem"),
		Prefix: "/agent/prod", Lease: 20 * time.Second, Name: "kpro5",
		HostDisruptions: HostDisruptions{MaxUnavailable: 2, Group: "gpu-hosts"}}
	if diff := cmp.Diff(want, c); diff != "" {
		t.Errorf("coordination (-want +got):\n%s", diff)
	}
	if p.Agent.StateDir != "/var/lib/agent" {
		t.Errorf("state_dir %q lost beside the block", p.Agent.StateDir)
	}

	p, diags = load(t, "agent {\n  coordination {\n    etcd = [\"http://127.0.0.1:2379\"]\n  }\n}\n", Options{})
	if diags.HasErrors() {
		t.Fatal(diags)
	}
	if c := p.Agent.Coordination; c.Prefix != DefaultCoordinationPrefix || c.Lease != DefaultCoordinationLease ||
		c.HostDisruptions != (HostDisruptions{MaxUnavailable: 1, Group: DefaultHostGroup}) {
		t.Errorf("defaults: %+v", c)
	}
	p, _ = load(t, "agent {\n  state_dir = \"/x\"\n}\n", Options{})
	if p.Agent.Coordination != nil {
		t.Error("a plan without the block has coordination")
	}
}

func TestCoordinationErrors(t *testing.T) {
	t.Parallel()
	block := func(body string) string { return "agent {\n  coordination {\n" + body + "  }\n}\n" }
	for _, tt := range []struct{ name, src, want string }{
		{"no endpoint", block("    etcd = []\n"), "No etcd endpoint @ 3:5"},
		{"missing etcd", block("    prefix = \"/a\"\n"), "Missing required argument @ 2:16"},
		{"not a URL", block("    etcd = [\"etcd1:2379\"]\n"), "Invalid etcd endpoint @ 3:5"},
		{"TLS over http", block("    etcd = [\"http://e:2379\"]\n    ca_file = \"/ca.pem\"\n"), "TLS file without https @ 4:5"},
		{"cert without key", block("    etcd = [\"https://e:2379\"]\n    cert_file = \"/c.pem\"\n"), "Incomplete client certificate @ 4:5"},
		{"short lease", block("    etcd = [\"http://e:2379\"]\n    lease = \"1s\"\n"), "Invalid lease @ 4:5"},
		{"fractional lease", block("    etcd = [\"http://e:2379\"]\n    lease = \"2500ms\"\n"), "Invalid lease @ 4:5"},
		{"slash in name", block("    etcd = [\"http://e:2379\"]\n    name = \"a/b\"\n"), "Invalid name @ 4:5"},
		{"root prefix", block("    etcd = [\"http://e:2379\"]\n    prefix = \"/\"\n"), "Invalid prefix @ 4:5"},
		{"unknown attribute", block("    etcd = [\"http://e:2379\"]\n    ttl = \"5s\"\n"), "Unsupported argument @ 4:5"},
		{"no host allowed", block("    etcd = [\"http://e:2379\"]\n    host_disruptions {\n      max_unavailable = 0\n    }\n"), "Invalid max_unavailable @ 4:5"},
		{"slash in host group", block("    etcd = [\"http://e:2379\"]\n    host_disruptions {\n      group = \"a/b\"\n    }\n"), "Invalid host group @ 4:5"},
		{"two host_disruptions", block("    etcd = [\"http://e:2379\"]\n    host_disruptions {}\n    host_disruptions {}\n"), "Duplicate host_disruptions block @ 5:5"},
		{"two blocks", "agent {\n  coordination {\n    etcd = [\"http://e:2379\"]\n  }\n  coordination {\n    etcd = [\"http://e:2379\"]\n  }\n}\n", "Duplicate coordination block @ 5:3"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, diags := load(t, tt.src, Options{})
			var got []string
			for _, d := range diags {
				got = append(got, fmt.Sprintf("%s @ %d:%d", d.Summary, d.Subject.Start.Line, d.Subject.Start.Column))
			}
			if len(got) != 1 || got[0] != tt.want {
				t.Errorf("diagnostics %q, want [%q]", got, tt.want)
			}
		})
	}
}
