package plans

import (
	"fmt"
	"net/url"
	"path/filepath"
	"strings"
	"time"

	"github.com/hashicorp/hcl/v2"
	"github.com/hashicorp/hcl/v2/gohcl"
)

// Coordination is the agent block's coordination block: the etcd cluster through which
// independent hosts share rollout permits and publish their status. Nil when the plan
// has none (then nothing is coordinated and nothing of etcd is touched).
type Coordination struct {
	// Etcd are the members' client URLs.
	Etcd []string
	// CAFile, CertFile and KeyFile are the TLS files (absolute: relative ones are
	// resolved against the plan's directory).
	CAFile, CertFile, KeyFile string
	// Prefix is this fleet's key prefix in etcd.
	Prefix string
	// Lease is the agent's lease: a dead host's permits and entry expire after it.
	Lease time.Duration
	// Name is this agent's name in the fleet ("": the hostname).
	Name string
	// HostDisruptions limits the hosts of the fleet that take every server down at once
	// (a driver replace, a reboot, agent drain): the host_disruptions block, or its
	// defaults (one host, group DefaultHostGroup) when the plan leaves it out.
	HostDisruptions HostDisruptions
	DeclRange       hcl.Range
}

// HostDisruptions is the coordination block's host_disruptions block.
type HostDisruptions struct {
	// MaxUnavailable is how many hosts of Group may be under disruption at once.
	MaxUnavailable int
	// Group names the hosts that share the limit (hosts of one prefix in other groups
	// do not count against it).
	Group string
}

// DefaultHostGroup is the host group of a plan without host_disruptions { group }: the
// whole prefix.
const DefaultHostGroup = "all"

// Coordination defaults.
const (
	DefaultCoordinationPrefix = "/agent"
	DefaultCoordinationLease  = 15 * time.Second
	// MinCoordinationLease is etcd's shortest lease (1.5 default election timeouts).
	MinCoordinationLease = 2 * time.Second
)

type coordinationBlock struct {
	Etcd     []string `hcl:"etcd"`
	CAFile   *string  `hcl:"ca_file,optional"`
	CertFile *string  `hcl:"cert_file,optional"`
	KeyFile  *string  `hcl:"key_file,optional"`
	Prefix   *string  `hcl:"prefix,optional"`
	Lease    *string  `hcl:"lease,optional"`
	Name     *string  `hcl:"name,optional"`
	// HostDisruptions is the optional host_disruptions block.
	HostDisruptions []hostDisruptionsBlock `hcl:"host_disruptions,block"`
}

type hostDisruptionsBlock struct {
	MaxUnavailable *int      `hcl:"max_unavailable,optional"`
	Group          *string   `hcl:"group,optional"`
	DefRange       hcl.Range `hcl:",def_range"`
}

// decodeCoordination checks the block (nil: none) and sets Agent.Coordination.
func (l *loader) decodeCoordination(blocks []*hcl.Block) {
	if len(blocks) == 0 {
		return
	}
	if len(blocks) > 1 {
		l.errorAt(blocks[1].DefRange, "Duplicate coordination block", "The agent block may have one coordination block.")
		return
	}
	b := blocks[0]
	var c coordinationBlock
	diags := gohcl.DecodeBody(b.Body, l.evalContext(false), &c)
	l.diags = append(l.diags, diags...)
	if diags.HasErrors() {
		return
	}
	out := &Coordination{Etcd: c.Etcd, Prefix: DefaultCoordinationPrefix, Lease: DefaultCoordinationLease, DeclRange: b.DefRange,
		HostDisruptions: HostDisruptions{MaxUnavailable: 1, Group: DefaultHostGroup}}
	bad := func(attr, summary, detail string) {
		l.errorAt(attrRange(b.Body, b.DefRange, attr), summary, detail)
	}
	if len(c.Etcd) == 0 {
		bad("etcd", "No etcd endpoint", `etcd lists the cluster's client URLs: etcd = ["https://etcd1:2379", "https://etcd2:2379", "https://etcd3:2379"].`)
		return
	}
	tlsWanted := false
	for _, e := range c.Etcd {
		u, err := url.Parse(e)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
			bad("etcd", "Invalid etcd endpoint", fmt.Sprintf("%q is not an etcd client URL; write it like \"https://etcd1:2379\".", e))
			return
		}
		tlsWanted = tlsWanted || u.Scheme == "https"
	}
	file := func(attr string, p *string) string {
		if p == nil || *p == "" {
			return ""
		}
		if !tlsWanted {
			bad(attr, "TLS file without https", fmt.Sprintf("%s is set but every etcd endpoint is http://: write the endpoints as https:// to use TLS.", attr))
		}
		if filepath.IsAbs(*p) {
			return *p
		}
		return filepath.Join(l.plan.Dir, *p)
	}
	out.CAFile, out.CertFile, out.KeyFile = file("ca_file", c.CAFile), file("cert_file", c.CertFile), file("key_file", c.KeyFile)
	if (out.CertFile == "") != (out.KeyFile == "") {
		bad("cert_file", "Incomplete client certificate", "cert_file and key_file go together: the client certificate and its key.")
	}
	if c.Prefix != nil {
		p := "/" + strings.Trim(*c.Prefix, "/")
		if p == "/" || strings.ContainsAny(*c.Prefix, " \t\n") {
			bad("prefix", "Invalid prefix", fmt.Sprintf("%q is not a key prefix; write it like \"/agent/prod\" (one per fleet).", *c.Prefix))
		}
		out.Prefix = p
	}
	if c.Lease != nil {
		d, err := time.ParseDuration(*c.Lease)
		if err != nil || d < MinCoordinationLease || d%time.Second != 0 {
			bad("lease", "Invalid lease", fmt.Sprintf("%q is not a lease etcd grants: write whole seconds, at least %s, like \"15s\".", *c.Lease, MinCoordinationLease))
		}
		out.Lease = d
	}
	if c.Name != nil {
		if *c.Name == "" || strings.ContainsAny(*c.Name, "/ \t\n") {
			bad("name", "Invalid name", fmt.Sprintf("%q cannot name a host in the fleet: leave it out for the hostname, or use one without slashes or spaces.", *c.Name))
		}
		out.Name = *c.Name
	}
	l.decodeHostDisruptions(c.HostDisruptions, &out.HostDisruptions)
	l.plan.Agent.Coordination = out
}

// decodeHostDisruptions checks the host_disruptions blocks (at most one) into hd, which
// holds the defaults.
func (l *loader) decodeHostDisruptions(blocks []hostDisruptionsBlock, hd *HostDisruptions) {
	if len(blocks) > 1 {
		l.errorAt(blocks[1].DefRange, "Duplicate host_disruptions block", "The coordination block may have one host_disruptions block.")
		return
	}
	if len(blocks) == 0 {
		return
	}
	b := blocks[0]
	if b.MaxUnavailable != nil {
		if *b.MaxUnavailable < 1 {
			l.errorAt(b.DefRange, "Invalid max_unavailable", fmt.Sprintf("host_disruptions { max_unavailable = %d } would never let a host be disrupted: write 1 or more (hosts of the group under disruption at once).", *b.MaxUnavailable))
		}
		hd.MaxUnavailable = *b.MaxUnavailable
	}
	if b.Group != nil {
		if *b.Group == "" || strings.ContainsAny(*b.Group, "/ \t\n") {
			l.errorAt(b.DefRange, "Invalid host group", fmt.Sprintf("%q cannot name a host group: use a name without slashes or spaces, like \"gpu-hosts\".", *b.Group))
		}
		hd.Group = *b.Group
	}
}
