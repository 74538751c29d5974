package incus

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Status codes Incus reports in status_code, for operations and instances
// alike.
const (
	StatusOperationCreated = 100
	StatusStarted          = 101
	StatusStopped          = 102
	StatusRunning          = 103
	StatusCancelling       = 104
	StatusPending          = 105
	StatusFrozen           = 110
	StatusError            = 112
	StatusReady            = 113
	StatusSuccess          = 200
	StatusFailure          = 400
	StatusCancelled        = 401
)

// ErrOperationGone is returned by WaitOperation when Incus no longer knows the
// operation: it finished (or never existed) and was already removed, so its
// outcome cannot be read any more. Callers that can observe the effect (an
// instance's status) should check it instead.
var ErrOperationGone = errors.New("operation no longer exists")

// maxWaitChunk bounds one long-poll of the wait endpoint, so that the client
// re-checks its own deadline and the connection does not sit idle for long.
const maxWaitChunk = 30 * time.Second

// Operation is an Incus background operation.
type Operation struct {
	ID          string              `json:"id"`
	Class       string              `json:"class"`
	Description string              `json:"description"`
	CreatedAt   time.Time           `json:"created_at"`
	UpdatedAt   time.Time           `json:"updated_at"`
	Status      string              `json:"status"`
	StatusCode  int                 `json:"status_code"`
	Resources   map[string][]string `json:"resources"`
	Metadata    map[string]any      `json:"metadata"`
	MayCancel   bool                `json:"may_cancel"`
	Err         string              `json:"err"`
	Location    string              `json:"location"`
}

// Done reports whether the operation reached a final state.
func (o *Operation) Done() bool { return o.StatusCode >= 200 }

// OperationError is a background operation that ended in failure or was
// cancelled. Incus reports it with HTTP 200 on the wait endpoint; the failure
// is in the operation's status and err.
type OperationError struct {
	Request     string // the request that started the operation, e.g. "PUT /1.0/instances/c1/state"
	ID          string
	Description string
	StatusCode  int    // StatusFailure or StatusCancelled
	Err         string // Incus' error text
}

func (e *OperationError) Error() string {
	what := "failed"
	if e.StatusCode == StatusCancelled {
		what = "was cancelled"
	}
	desc := e.Description
	if desc == "" {
		desc = "operation " + e.ID
	}
	msg := e.Err
	if msg == "" {
		msg = "no error text"
	}
	if e.Request != "" {
		return fmt.Sprintf("incus: %s: %s %s: %s", e.Request, desc, what, msg)
	}
	return fmt.Sprintf("incus: %s %s: %s", desc, what, msg)
}

// WaitOperation waits until the operation id finishes and returns it. The wait
// ends at the context's deadline or after the client's operation timeout,
// whichever comes first; the error then wraps context.DeadlineExceeded. A
// failed or cancelled operation returns it together with an *OperationError.
// An operation Incus no longer knows returns an error wrapping
// ErrOperationGone.
func (c *Client) WaitOperation(ctx context.Context, id string) (*Operation, error) {
	return c.waitOperation(ctx, id, "")
}

func (c *Client) waitOperation(ctx context.Context, id, origin string) (*Operation, error) {
	if id == "" || strings.ContainsAny(id, "/?#") {
		return nil, fmt.Errorf("incus: invalid operation id %q", id)
	}
	ctx, cancel := context.WithTimeout(ctx, c.opTimeout)
	defer cancel()
	deadline, _ := ctx.Deadline()
	path := "/1.0/operations/" + escape(id) + "/wait"
	var last *Operation
	for {
		remaining := time.Until(deadline)
		if remaining <= 0 {
			return last, timeoutError(id, origin, last, ctx.Err())
		}
		chunk := min(remaining, maxWaitChunk)
		// Round down, so that the server answers before our deadline.
		secs := max(int(chunk/time.Second), 1)
		// The server holds the request for up to secs seconds; give the
		// transport a little more before it gives up on the reply.
		rctx, rcancel := context.WithTimeout(ctx, chunk+5*time.Second)
		r, _, err := c.roundTrip(rctx, request{
			method: http.MethodGet,
			path:   path,
			query:  url.Values{"timeout": {strconv.Itoa(secs)}},
		})
		rcancel()
		if err != nil {
			if IsNotFound(err) {
				return last, fmt.Errorf("incus: operation %s%s: %w", id, fromOrigin(origin), ErrOperationGone)
			}
			if ctx.Err() != nil {
				return last, timeoutError(id, origin, last, ctx.Err())
			}
			return last, err
		}
		var op Operation
		if r.Type == typeError {
			// Incus 6.0 answers the wait with HTTP 200 and an error
			// envelope both when the operation failed and when the wait
			// timed out; only the operation itself tells which.
			got, err := c.getOperation(ctx, id)
			switch {
			case IsNotFound(err):
				return last, &OperationError{Request: origin, ID: id, StatusCode: StatusFailure, Err: r.Error}
			case err != nil:
				return last, err
			}
			op = *got
			if op.Done() && op.Err == "" && op.StatusCode != StatusSuccess {
				op.Err = r.Error
			}
		} else if err := r.metadata(&op); err != nil {
			return last, fmt.Errorf("incus: wait for operation %s: %w", id, err)
		}
		last = &op
		if !op.Done() {
			continue
		}
		if op.StatusCode == StatusSuccess {
			return &op, nil
		}
		return &op, &OperationError{
			Request: origin, ID: op.ID, Description: op.Description,
			StatusCode: op.StatusCode, Err: op.Err,
		}
	}
}

// getOperation reads an operation's current state without waiting.
func (c *Client) getOperation(ctx context.Context, id string) (*Operation, error) {
	var op Operation
	if _, err := c.get(ctx, "/1.0/operations/"+escape(id), &op); err != nil {
		return nil, err
	}
	return &op, nil
}

func fromOrigin(origin string) string {
	if origin == "" {
		return ""
	}
	return " (from " + origin + ")"
}

func timeoutError(id, origin string, last *Operation, cause error) error {
	if cause == nil {
		cause = context.DeadlineExceeded
	}
	state := ""
	if last != nil {
		state = ", last status " + last.Status
	}
	return fmt.Errorf("incus: wait for operation %s%s%s: %w", id, fromOrigin(origin), state, cause)
}

// operationID extracts the id from an operation URL such as
// "/1.0/operations/<id>".
func operationID(u string) (string, error) {
	p := u
	if i := strings.IndexAny(p, "?#"); i >= 0 {
		p = p[:i]
	}
	const prefix = "/1.0/operations/"
	if !strings.HasPrefix(p, prefix) || len(p) == len(prefix) || strings.Contains(p[len(prefix):], "/") {
		return "", fmt.Errorf("unexpected operation url %q", u)
	}
	return p[len(prefix):], nil
}

// run performs a request that may start a background operation and waits for
// it. A synchronous answer returns (nil, nil). When the operation vanished
// before the wait could read it, the error wraps ErrOperationGone and the
// operation returned is the one announced with the request.
func (c *Client) run(ctx context.Context, req request) (*Operation, error) {
	op, err := c.runOnce(ctx, req)
	// An instance busy with another operation (a create or start that an agent killed
	// mid-apply left running inside incusd) refuses new ones until it finishes, either at
	// once or through the failed operation: wait for it, within ctx, rather than fail an
	// apply that would succeed a moment later.
	for wait := 100 * time.Millisecond; err != nil && isBusy(err); wait = min(2*wait, 2*time.Second) {
		select {
		case <-ctx.Done():
			return op, err
		case <-time.After(wait):
		}
		op, err = c.runOnce(ctx, req)
	}
	return op, err
}

func (c *Client) runOnce(ctx context.Context, req request) (*Operation, error) {
	r, _, err := c.do(ctx, req)
	if err != nil {
		return nil, err
	}
	if r.Type == typeSync {
		return nil, nil
	}
	id, err := operationID(r.Operation)
	if err != nil {
		return nil, fmt.Errorf("incus: %s: %w", req, err)
	}
	var announced *Operation
	if len(r.Metadata) > 0 {
		var op Operation
		if json.Unmarshal(r.Metadata, &op) == nil {
			announced = &op
		}
	}
	op, err := c.waitOperation(ctx, id, req.String())
	if errors.Is(err, ErrOperationGone) {
		return announced, err
	}
	return op, err
}

// isBusy reports an Incus refusal because the instance runs another operation
// ("Instance is busy running a \"create\" operation").
func isBusy(err error) bool {
	const busy = "is busy running a"
	var e *Error
	var oe *OperationError
	return (errors.As(err, &e) && strings.Contains(e.Message, busy)) || (errors.As(err, &oe) && strings.Contains(oe.Err, busy))
}
