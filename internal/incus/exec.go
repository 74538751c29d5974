package incus

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// maxExecOutput bounds how much of each recorded output stream Exec reads.
const maxExecOutput = 64 << 20

// ExecRequest is a command to run inside an instance.
type ExecRequest struct {
	Command []string          // argv; Command[0] is looked up in PATH inside the instance
	Env     map[string]string // added to Incus' default environment (PATH, HOME, ...)
	Cwd     string            // working directory; empty: Incus' default (/root)
	User    uint32            // uid to run as (0: root)
	Group   uint32            // gid to run as
}

// ExecResult is the outcome of a finished command.
type ExecResult struct {
	ExitCode int
	Stdout   []byte
	Stderr   []byte
}

// execPost is the body of POST /1.0/instances/{name}/exec.
type execPost struct {
	Command      []string          `json:"command"`
	Environment  map[string]string `json:"environment,omitempty"`
	Cwd          string            `json:"cwd,omitempty"`
	User         uint32            `json:"user"`
	Group        uint32            `json:"group"`
	WaitForWS    bool              `json:"wait-for-websocket"`
	Interactive  bool              `json:"interactive"`
	RecordOutput bool              `json:"record-output"`
	Width        int               `json:"width"`
	Height       int               `json:"height"`
}

// Exec runs a command in a running instance without websockets: Incus records
// stdout and stderr to log files, Exec waits for the command (within the
// context's deadline and the client's operation timeout), takes the exit code
// from the operation, fetches both logs and deletes them.
//
// A non-zero exit code is not an error; read ExecResult.ExitCode. Exec returns
// a result together with an error when Incus reports the operation failed
// but still gave an exit code (e.g. the command was not found: an
// *OperationError, exit code 127 or so), and when the output was read but its
// log files could not be deleted.
func (c *Client) Exec(ctx context.Context, instance string, req ExecRequest) (*ExecResult, error) {
	if len(req.Command) == 0 {
		return nil, fmt.Errorf("incus: exec in %s: empty command", instance)
	}
	r := request{
		method: http.MethodPost,
		path:   instancePath(instance) + "/exec",
		body: execPost{
			Command:      req.Command,
			Environment:  req.Env,
			Cwd:          req.Cwd,
			User:         req.User,
			Group:        req.Group,
			RecordOutput: true,
		},
	}
	op, runErr := c.run(ctx, r)
	if errors.Is(runErr, ErrOperationGone) {
		return nil, fmt.Errorf("exec %q in %s: exit code lost: %w", req.Command[0], instance, runErr)
	}
	var opErr *OperationError
	failedWithCode := errors.As(runErr, &opErr) && op != nil && op.Metadata["return"] != nil
	if runErr != nil && !failedWithCode {
		return nil, fmt.Errorf("exec %q in %s: %w", req.Command[0], instance, runErr)
	}
	if op == nil {
		return nil, fmt.Errorf("incus: exec %q in %s: %s answered without an operation", req.Command[0], instance, r)
	}
	res, err := c.execResult(ctx, op)
	if err = errors.Join(runErr, err); err != nil {
		err = fmt.Errorf("exec %q in %s: %w", req.Command[0], instance, err)
	}
	return res, err
}

// execResult reads the exit code and the recorded output of a finished exec
// operation, then deletes the output files.
func (c *Client) execResult(ctx context.Context, op *Operation) (*ExecResult, error) {
	code, paths, err := execMetadata(op)
	if err != nil {
		return nil, err
	}
	res := &ExecResult{ExitCode: code}
	var errs []error
	for fd, dst := range map[string]*[]byte{"1": &res.Stdout, "2": &res.Stderr} {
		p, ok := paths[fd]
		if !ok {
			errs = append(errs, fmt.Errorf("incus: exec operation %s: no log for fd %s", op.ID, fd))
			continue
		}
		if !strings.HasPrefix(p, "/1.0/instances/") {
			errs = append(errs, fmt.Errorf("incus: exec operation %s: unexpected log path %q", op.ID, p))
			continue
		}
		data, err := c.readAll(ctx, request{method: http.MethodGet, path: p}, maxExecOutput)
		if err != nil {
			return nil, errors.Join(append(errs, err, c.deleteLogs(ctx, paths))...)
		}
		*dst = data
	}
	if err := c.deleteLogs(ctx, paths); err != nil {
		errs = append(errs, err)
	}
	return res, errors.Join(errs...)
}

func (c *Client) deleteLogs(ctx context.Context, paths map[string]string) error {
	var errs []error
	for _, p := range paths {
		if !strings.HasPrefix(p, "/1.0/instances/") {
			continue
		}
		if _, _, err := c.do(ctx, request{method: http.MethodDelete, path: p}); err != nil && !IsNotFound(err) {
			errs = append(errs, fmt.Errorf("delete exec log: %w", err))
		}
	}
	return errors.Join(errs...)
}

// execMetadata reads the exit code and the output log paths (by fd: "1",
// "2") from a finished exec operation.
func execMetadata(op *Operation) (int, map[string]string, error) {
	code, ok := op.Metadata["return"].(float64)
	if !ok {
		return 0, nil, fmt.Errorf("incus: exec operation %s: no exit code in metadata", op.ID)
	}
	paths := map[string]string{}
	if out, ok := op.Metadata["output"].(map[string]any); ok {
		for fd, v := range out {
			if p, ok := v.(string); ok {
				paths[fd] = p
			}
		}
	}
	return int(code), paths, nil
}

// readAll performs a request whose successful answer is raw bytes.
func (c *Client) readAll(ctx context.Context, req request, limit int64) ([]byte, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.opTimeout)
		defer cancel()
	}
	resp, err := c.send(ctx, req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return nil, fmt.Errorf("incus: %s: read: %w", req, err)
	}
	if int64(len(data)) > limit {
		return nil, fmt.Errorf("incus: %s: more than %d bytes", req, limit)
	}
	return data, nil
}
