package incus

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// InstancePut is the writable part of an instance: what PUT replaces and
// what an ETag covers.
type InstancePut struct {
	Architecture string                       `json:"architecture,omitempty"`
	Config       map[string]string            `json:"config"`
	Devices      map[string]map[string]string `json:"devices"`
	Ephemeral    bool                         `json:"ephemeral"`
	Profiles     []string                     `json:"profiles"`
	Stateful     bool                         `json:"stateful"`
	Description  string                       `json:"description"`
}

// Instance is an Incus instance as GET /1.0/instances/{name} returns it.
// Config and Devices are the instance's own; the Expanded maps include what
// its profiles add.
type Instance struct {
	InstancePut
	Name            string                       `json:"name"`
	Type            string                       `json:"type"`
	Status          string                       `json:"status"`
	StatusCode      int                          `json:"status_code"`
	CreatedAt       time.Time                    `json:"created_at"`
	LastUsedAt      time.Time                    `json:"last_used_at"`
	Location        string                       `json:"location"`
	Project         string                       `json:"project"`
	ExpandedConfig  map[string]string            `json:"expanded_config"`
	ExpandedDevices map[string]map[string]string `json:"expanded_devices"`
}

// Running reports whether the instance is running.
func (i *Instance) Running() bool { return i.StatusCode == StatusRunning }

// InstanceSource says where a new instance's root filesystem comes from. Only
// local images are used by the agent: set Alias or Fingerprint.
type InstanceSource struct {
	Type        string `json:"type"` // "image" (the default when empty)
	Alias       string `json:"alias,omitempty"`
	Fingerprint string `json:"fingerprint,omitempty"`
	Server      string `json:"server,omitempty"`
	Protocol    string `json:"protocol,omitempty"`
}

// InstancesPost is the body of POST /1.0/instances.
type InstancesPost struct {
	InstancePut
	Name   string         `json:"name"`
	Type   string         `json:"type,omitempty"` // "container" (default) or "virtual-machine"
	Source InstanceSource `json:"source"`
	Start  bool           `json:"start,omitempty"`
	// Target is the cluster member to create the instance on, sent as
	// ?target=; empty lets the cluster (or the lone server) choose.
	Target string `json:"-"`
}

// InstancePatch is the body of PATCH /1.0/instances/{name}: the given config
// keys and devices are merged into the instance; nil fields are left alone.
type InstancePatch struct {
	Config      map[string]string            `json:"config,omitempty"`
	Devices     map[string]map[string]string `json:"devices,omitempty"`
	Profiles    []string                     `json:"profiles,omitempty"`
	Description *string                      `json:"description,omitempty"`
}

// InstanceState is GET /1.0/instances/{name}/state.
type InstanceState struct {
	Status     string                  `json:"status"`
	StatusCode int                     `json:"status_code"`
	Pid        int64                   `json:"pid"` // the init process, in the host's PID namespace; 0 when stopped
	Processes  int64                   `json:"processes"`
	StartedAt  time.Time               `json:"started_at"`
	Network    map[string]NetworkState `json:"network"`
}

// NetworkState is one network interface of a running instance.
type NetworkState struct {
	Addresses []NetworkAddress `json:"addresses"`
	Hwaddr    string           `json:"hwaddr"`
	HostName  string           `json:"host_name"`
	MTU       int              `json:"mtu"`
	State     string           `json:"state"`
	Type      string           `json:"type"`
}

// NetworkAddress is one address of an interface.
type NetworkAddress struct {
	Family  string `json:"family"` // inet or inet6
	Address string `json:"address"`
	Netmask string `json:"netmask"`
	Scope   string `json:"scope"` // global, link, local
}

func instancePath(name string) string { return "/1.0/instances/" + escape(name) }

// GetInstance returns the instance and its ETag, to pass to UpdateInstance.
// A missing instance is an *Error with status 404 (see IsNotFound).
func (c *Client) GetInstance(ctx context.Context, name string) (*Instance, string, error) {
	var inst Instance
	etag, err := c.get(ctx, instancePath(name), &inst)
	if err != nil {
		return nil, "", err
	}
	return &inst, etag, nil
}

// CreateInstance creates an instance and waits until it exists. With
// Source.Type empty the source is an image (by alias or fingerprint).
func (c *Client) CreateInstance(ctx context.Context, req InstancesPost) error {
	if req.Name == "" {
		return errors.New("incus: create instance: empty name")
	}
	if req.Source.Type == "" {
		req.Source.Type = "image"
	}
	if req.Source.Type == "image" && req.Source.Alias == "" && req.Source.Fingerprint == "" {
		return fmt.Errorf("incus: create instance %s: image source needs an alias or a fingerprint", req.Name)
	}
	r := request{method: http.MethodPost, path: "/1.0/instances", body: req}
	if req.Target != "" {
		r.query = url.Values{"target": {req.Target}}
	}
	_, err := c.run(ctx, r)
	if errors.Is(err, ErrOperationGone) {
		// The outcome was lost; the instance's existence is the outcome.
		if _, _, gerr := c.GetInstance(ctx, req.Name); gerr == nil {
			return nil
		}
	}
	if err != nil {
		return fmt.Errorf("create instance %s: %w", req.Name, err)
	}
	return nil
}

// UpdateInstance replaces the instance's writable fields (PUT). With a
// non-empty etag (from GetInstance) Incus refuses the update with a 412
// *Error when the instance changed in between; an empty etag updates
// unconditionally.
func (c *Client) UpdateInstance(ctx context.Context, name string, put InstancePut, etag string) error {
	r := request{method: http.MethodPut, path: instancePath(name), body: put}
	if etag != "" {
		r.header = http.Header{"If-Match": {etag}}
	}
	if _, err := c.run(ctx, r); err != nil && !errors.Is(err, ErrOperationGone) {
		return fmt.Errorf("update instance %s: %w", name, err)
	}
	return nil
}

// PatchInstance merges patch into the instance (PATCH), with the same ETag
// rule as UpdateInstance.
func (c *Client) PatchInstance(ctx context.Context, name string, patch InstancePatch, etag string) error {
	r := request{method: http.MethodPatch, path: instancePath(name), body: patch}
	if etag != "" {
		r.header = http.Header{"If-Match": {etag}}
	}
	if _, err := c.run(ctx, r); err != nil && !errors.Is(err, ErrOperationGone) {
		return fmt.Errorf("patch instance %s: %w", name, err)
	}
	return nil
}

// DeleteInstance deletes a stopped instance and waits until it is gone.
// Deleting an instance that does not exist is a 404 *Error.
func (c *Client) DeleteInstance(ctx context.Context, name string) error {
	_, err := c.run(ctx, request{method: http.MethodDelete, path: instancePath(name)})
	if errors.Is(err, ErrOperationGone) {
		if _, _, gerr := c.GetInstance(ctx, name); IsNotFound(gerr) {
			return nil
		}
	}
	if err != nil {
		return fmt.Errorf("delete instance %s: %w", name, err)
	}
	return nil
}

// InstanceState returns the live state of an instance: status, init PID,
// network addresses.
//
// Incus answers this read with a transient 500 while an instance changes state (6.0:
// "Invalid PID" during a stop, for as long as the stop takes), so a server error is
// retried with a growing pause for up to stateReadPatience: a fixed number of quick tries
// (1 s in all) ran out during a 5 s shutdown on a loaded machine.
func (c *Client) InstanceState(ctx context.Context, name string) (*InstanceState, error) {
	deadline := time.Now().Add(stateReadPatience)
	pause := 100 * time.Millisecond
	for {
		var st InstanceState
		_, err := c.get(ctx, instancePath(name)+"/state", &st)
		if err == nil {
			return &st, nil
		}
		var e *Error
		if !errors.As(err, &e) || e.Status < 500 || time.Now().Add(pause).After(deadline) {
			return nil, err
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(pause):
		}
		pause = min(2*pause, time.Second)
	}
}

// stateReadPatience bounds the retries of a state read that failed with a server error:
// longer than Incus's own shutdown timeout (5 s here, 10 s by default) and a margin.
const stateReadPatience = 15 * time.Second

// stateChange is the body of PUT /1.0/instances/{name}/state.
type stateChange struct {
	Action   string `json:"action"`
	Timeout  int    `json:"timeout"`
	Force    bool   `json:"force"`
	Stateful bool   `json:"stateful"`
}

// Start starts the instance and waits until Incus reports it started. When LXC fails to
// start it, Incus says only "Failed to run: incusd forkstart …: exit status 1"; LXC's own
// log says why, and its last lines are added to the error. Such a start is tried once
// more first: on a loaded machine (CI, 2 cores) a start of a busybox container failed
// after 24 s once, and starting a stopped instance is harmless to repeat.
func (c *Client) Start(ctx context.Context, name string) error {
	start := stateChange{Action: "start"}
	err := c.changeState(ctx, name, start, StatusRunning)
	if err == nil || !strings.Contains(err.Error(), "forkstart") || ctx.Err() != nil {
		return err
	}
	first := c.lxcLog(ctx, name)
	if again := c.changeState(ctx, name, start, StatusRunning); again == nil {
		return nil
	} else if log := c.lxcLog(ctx, name); log != "" {
		first = log
	}
	if first == "" {
		return err
	}
	return fmt.Errorf("%w (tried twice)\nlxc.log errors:\n%s", err, first)
}

// lxcLog is the first ERROR lines of the instance's LXC log (GET …/logs/lxc.log), the
// first being the cause and the rest its echoes; "" when it cannot be read.
func (c *Client) lxcLog(ctx context.Context, name string) string {
	b, err := c.readAll(ctx, request{method: http.MethodGet, path: instancePath(name) + "/logs/lxc.log"}, 1<<20)
	if err != nil {
		return ""
	}
	var errs []string
	for line := range strings.Lines(string(b)) {
		if strings.Contains(line, " ERROR ") && len(errs) < 6 {
			errs = append(errs, strings.TrimRight(line, "\n"))
		}
	}
	return strings.Join(errs, "\n")
}

// Stop shuts the instance down cleanly (the init process gets the halt
// signal) and waits up to timeout for it to stop. A timeout that passes
// fails the operation and leaves the instance running: escalate with Kill.
// The timeout must be positive, because Incus treats zero as a kill.
func (c *Client) Stop(ctx context.Context, name string, timeout time.Duration) error {
	secs, err := timeoutSeconds(timeout)
	if err != nil {
		return fmt.Errorf("stop instance %s: %w", name, err)
	}
	return c.changeState(ctx, name, stateChange{Action: "stop", Timeout: secs}, StatusStopped)
}

// Kill stops the instance at once, without a clean shutdown.
func (c *Client) Kill(ctx context.Context, name string) error {
	return c.changeState(ctx, name, stateChange{Action: "stop", Force: true}, StatusStopped)
}

// Restart restarts the instance cleanly, waiting up to timeout (positive) for
// the shutdown half.
func (c *Client) Restart(ctx context.Context, name string, timeout time.Duration) error {
	secs, err := timeoutSeconds(timeout)
	if err != nil {
		return fmt.Errorf("restart instance %s: %w", name, err)
	}
	return c.changeState(ctx, name, stateChange{Action: "restart", Timeout: secs}, StatusRunning)
}

func timeoutSeconds(d time.Duration) (int, error) {
	if d <= 0 {
		return 0, fmt.Errorf("timeout must be positive, got %s (use Kill for an immediate stop)", d)
	}
	return int((d + time.Second - 1) / time.Second), nil
}

func (c *Client) changeState(ctx context.Context, name string, sc stateChange, want int) error {
	r := request{method: http.MethodPut, path: instancePath(name) + "/state", body: sc}
	_, err := c.run(ctx, r)
	// The outcome was lost, or the change failed because the instance is already where it
	// was asked to go (a start that another agent, killed mid-apply, left in flight): for
	// start and stop the instance's status is the outcome. Not for restart: a running
	// instance says nothing about whether it restarted.
	if err != nil && (errors.Is(err, ErrOperationGone) || sc.Action != "restart") {
		if st, serr := c.InstanceState(ctx, name); serr == nil && st.StatusCode == want {
			return nil
		}
	}
	if err != nil {
		return fmt.Errorf("%s instance %s: %w", sc.Action, name, err)
	}
	return nil
}
