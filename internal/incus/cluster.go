package incus

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"time"
)

// An Incus cluster is one API for every member: any member's socket creates, reads and
// execs in instances on all of them, forwarding to the member that holds the instance
// (Instance.Location). The calls here are the cluster's own: its members and their state,
// placement moves, and forming a cluster (the test harness's).

// Member states (ClusterMember.Status).
const (
	MemberOnline    = "Online"
	MemberOffline   = "Offline"
	MemberEvacuated = "Evacuated"
)

// ClusterMember is one member as GET /1.0/cluster/members/{name} returns it.
type ClusterMember struct {
	ServerName    string            `json:"server_name"`
	URL           string            `json:"url"`
	Database      bool              `json:"database"`
	Status        string            `json:"status"`  // Online, Offline, Evacuated, …
	Message       string            `json:"message"` // e.g. "No heartbeat for 15.8s (…)"
	Architecture  string            `json:"architecture"`
	Roles         []string          `json:"roles"`
	FailureDomain string            `json:"failure_domain"`
	Description   string            `json:"description"`
	Config        map[string]string `json:"config"`
	Groups        []string          `json:"groups"`
}

// Online reports whether the member answers the cluster's heartbeats and takes
// instances.
func (m *ClusterMember) Online() bool { return m.Status == MemberOnline }

// Describe is "member m2 is Offline (No heartbeat for 15.8s …)", for messages.
func (m *ClusterMember) Describe() string {
	s := fmt.Sprintf("member %s is %s", m.ServerName, m.Status)
	if m.Message != "" && m.Message != "Fully operational" {
		s += " (" + m.Message + ")"
	}
	return s
}

// Cluster is GET /1.0/cluster: whether the daemon is clustered and its member name.
type Cluster struct {
	ServerName string `json:"server_name"`
	Enabled    bool   `json:"enabled"`
	// MemberConfig lists the member-specific keys a joining member must give
	// (a storage pool's source, …).
	MemberConfig []MemberConfigKey `json:"member_config"`
}

// MemberConfigKey is one member-specific key a joining member fills in.
type MemberConfigKey struct {
	Entity      string `json:"entity"` // storage-pool, network, …
	Name        string `json:"name"`
	Key         string `json:"key"`
	Value       string `json:"value"`
	Description string `json:"description,omitempty"`
}

// Cluster returns the daemon's cluster state. A daemon that is not clustered answers
// Enabled false and an empty ServerName.
func (c *Client) Cluster(ctx context.Context) (*Cluster, error) {
	var cl Cluster
	if _, err := c.get(ctx, "/1.0/cluster", &cl); err != nil {
		return nil, err
	}
	return &cl, nil
}

// ClusterMembers lists the members with their state. A daemon that is not clustered
// answers an empty list.
func (c *Client) ClusterMembers(ctx context.Context) ([]ClusterMember, error) {
	var ms []ClusterMember
	if _, err := c.get(ctx, "/1.0/cluster/members?recursion=1", &ms); err != nil {
		return nil, err
	}
	return ms, nil
}

// ClusterMember returns one member; an unknown member is a 404 *Error (IsNotFound).
func (c *Client) ClusterMember(ctx context.Context, name string) (*ClusterMember, error) {
	var m ClusterMember
	if _, err := c.get(ctx, "/1.0/cluster/members/"+escape(name), &m); err != nil {
		return nil, err
	}
	return &m, nil
}

// MoveInstance moves a stopped instance to another member (incus move --target): a
// migration within the cluster, its root filesystem copied when the storage is not
// shared. Incus refuses to move a running container.
func (c *Client) MoveInstance(ctx context.Context, name, target string) error {
	if target == "" {
		return fmt.Errorf("incus: move instance %s: empty target member", name)
	}
	r := request{method: http.MethodPost, path: instancePath(name), query: url.Values{"target": {target}},
		body: map[string]any{"name": name, "migration": true}}
	if _, err := c.run(ctx, r); err != nil {
		if errors.Is(err, ErrOperationGone) {
			if inst, _, gerr := c.GetInstance(ctx, name); gerr == nil && inst.Location == target {
				return nil
			}
		}
		return fmt.Errorf("move instance %s to member %s: %w", name, target, err)
	}
	return nil
}

// JoinToken is the decoded join token of a new member (incus cluster add NAME).
type JoinToken struct {
	ServerName  string    `json:"server_name"`
	Fingerprint string    `json:"fingerprint"` // of the cluster certificate
	Addresses   []string  `json:"addresses"`   // online members to join through
	Secret      string    `json:"secret"`
	ExpiresAt   time.Time `json:"expires_at"`
}

// String is the token as `incus cluster add` prints it: its JSON in base64.
func (t JoinToken) String() string {
	data, _ := json.Marshal(t)
	return base64.StdEncoding.EncodeToString(data)
}

// AddMember asks the cluster for a join token for a new member named name
// (POST /1.0/cluster/members). The token's operation stays running until the member
// joins or the token expires, so the answer is read without waiting for it.
func (c *Client) AddMember(ctx context.Context, name string) (JoinToken, error) {
	req := request{method: http.MethodPost, path: "/1.0/cluster/members", body: map[string]string{"server_name": name}}
	r, _, err := c.do(ctx, req)
	if err != nil {
		return JoinToken{}, fmt.Errorf("add cluster member %s: %w", name, err)
	}
	var op struct {
		Metadata struct {
			ServerName  string    `json:"serverName"`
			Fingerprint string    `json:"fingerprint"`
			Addresses   []string  `json:"addresses"`
			Secret      string    `json:"secret"`
			ExpiresAt   time.Time `json:"expiresAt"`
		} `json:"metadata"`
	}
	if err := r.metadata(&op); err != nil {
		return JoinToken{}, fmt.Errorf("add cluster member %s: %w", name, err)
	}
	m := op.Metadata
	if m.Secret == "" || len(m.Addresses) == 0 {
		return JoinToken{}, fmt.Errorf("add cluster member %s: the answer holds no join token", name)
	}
	return JoinToken{ServerName: m.ServerName, Fingerprint: m.Fingerprint, Addresses: m.Addresses, Secret: m.Secret, ExpiresAt: m.ExpiresAt}, nil
}

// clusterPut is the body of PUT /1.0/cluster (bootstrap or join).
type clusterPut struct {
	ServerName         string            `json:"server_name"`
	Enabled            bool              `json:"enabled"`
	MemberConfig       []MemberConfigKey `json:"member_config,omitempty"`
	ClusterAddress     string            `json:"cluster_address,omitempty"`
	ClusterCertificate string            `json:"cluster_certificate,omitempty"`
	ServerAddress      string            `json:"server_address,omitempty"`
	ClusterToken       string            `json:"cluster_token,omitempty"`
}

// EnableCluster turns a lone daemon into the first member of a new cluster named
// name. Its core.https_address must be set first.
func (c *Client) EnableCluster(ctx context.Context, name string) error {
	r := request{method: http.MethodPut, path: "/1.0/cluster", body: clusterPut{ServerName: name, Enabled: true}}
	if _, err := c.run(ctx, r); err != nil {
		return fmt.Errorf("enable clustering as member %s: %w", name, err)
	}
	return nil
}

// JoinCluster makes this (fresh) daemon join the cluster of token, as the member the
// token was made for, reachable by the others at address (its core.https_address).
// clusterCert is the cluster's certificate (PEM; GET /1.0 environment.certificate of a
// member); memberConfig fills the member-specific keys (a storage pool's source). This
// is what `incus admin init --preseed` sends for cluster_token and member_config.
func (c *Client) JoinCluster(ctx context.Context, token JoinToken, address, clusterCert string, memberConfig []MemberConfigKey) error {
	body := clusterPut{
		ServerName: token.ServerName, Enabled: true, MemberConfig: memberConfig,
		ClusterAddress: token.Addresses[0], ClusterCertificate: clusterCert,
		ServerAddress: address, ClusterToken: token.String(),
	}
	if _, err := c.run(ctx, request{method: http.MethodPut, path: "/1.0/cluster", body: body}); err != nil {
		return fmt.Errorf("join the cluster as member %s: %w", token.ServerName, err)
	}
	return nil
}

// InstanceMember returns the member an instance is on, read from the cluster's list
// (GET /1.0/instances?recursion=1 with a name filter), which answers from the
// cluster's database for a member that is offline, where GET /1.0/instances/{name}
// fails with a 500 ("Server isn't ready yet", "Missing event connection with target
// cluster member"). A missing instance is a 404 *Error.
//
// The list asks every member the cluster reports online, so a member whose daemon hangs
// but has not yet missed its heartbeats holds it up to the cluster's own 30 s limit (in
// CI, a container's whole reconcile). The list runs under WhileOnline: once the cluster
// reports such a member fallen, it is asked again, and answered from the database.
func (c *Client) InstanceMember(ctx context.Context, name string) (string, error) {
	var member string
	err := c.WhileOnline(ctx, "", func(ctx context.Context) (err error) {
		member, err = c.instanceMember(ctx, name)
		return err
	})
	if _, ok := errors.AsType[*MemberFellError](err); ok {
		return c.instanceMember(ctx, name)
	}
	return member, err
}

func (c *Client) instanceMember(ctx context.Context, name string) (string, error) {
	var list []Instance
	q := url.Values{"recursion": {"1"}, "filter": {"name eq " + name}}
	if _, err := c.get(ctx, "/1.0/instances?"+q.Encode(), &list); err != nil {
		return "", err
	}
	for _, inst := range list {
		if inst.Name == name {
			return inst.Location, nil
		}
	}
	return "", &Error{Method: http.MethodGet, Path: "/1.0/instances", Status: http.StatusNotFound, Message: "instance " + name + " not found"}
}

// MemberFellError is WhileOnline's error when a member the cluster reported online fell
// while the call was in flight: Member is the cluster's word on it now.
type MemberFellError struct{ Member *ClusterMember }

func (e *MemberFellError) Error() string {
	return e.Member.Describe() + ", and a call forwarded to it was abandoned"
}

// MemberGuardEvery is how often WhileOnline asks the cluster about its members while a
// call is in flight: one GET the cluster's database answers, and most calls end before
// the first.
const MemberGuardEvery = time.Second

// WhileOnline runs f, a call the cluster forwards to member ("": to every member, as
// the instance list does), and ends it with a *MemberFellError as soon as the cluster
// reports that member (with "", any member online when f began) no longer online. A
// call forwarded to a member whose incusd hangs does not end when the cluster marks the
// member Offline: it waits until the member is back (measured: as long as it was
// frozen), or for the cluster's own limit where it has one. On a daemon that is not in
// a cluster, or when the cluster does not answer, f runs unguarded.
func (c *Client) WhileOnline(ctx context.Context, member string, f func(context.Context) error) error {
	fctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	done := make(chan struct{})
	defer close(done)
	go func() {
		online := map[string]bool{} // the members to watch, as found online at the start
		first := true
		t := time.NewTicker(MemberGuardEvery)
		defer t.Stop()
		for {
			ms, err := c.membersNamed(fctx, member)
			if err != nil && first {
				return // not a cluster, or no answer: nothing to guard with
			}
			for _, m := range ms {
				switch {
				case first && m.Online():
					online[m.ServerName] = true
				case online[m.ServerName] && !m.Online():
					cancel(&MemberFellError{Member: &m})
					return
				}
			}
			first = false
			select {
			case <-done:
				return
			case <-fctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	err := f(fctx)
	if fell, ok := errors.AsType[*MemberFellError](context.Cause(fctx)); ok && err != nil {
		return fell
	}
	return err
}

// membersNamed is the named member, or every member for "", under a deadline of its own
// (the member the client talks to may itself be the one that hangs).
func (c *Client) membersNamed(ctx context.Context, name string) ([]ClusterMember, error) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if name == "" {
		return c.ClusterMembers(ctx)
	}
	m, err := c.ClusterMember(ctx, name)
	if err != nil {
		return nil, err
	}
	return []ClusterMember{*m}, nil
}
