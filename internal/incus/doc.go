// Package incus is the agent's own small, typed client for the Incus REST API,
// spoken over the daemon's local unix socket with net/http.
//
// The upstream Go client (github.com/lxc/incus/client) is not available to
// this project, and the agent needs only a narrow slice of the API: server
// info, instances (get with ETag, create, put with If-Match, patch, delete),
// instance state changes, exec without websockets (record-output), file push
// and pull, and image lookup and import. Everything else is left out on
// purpose.
//
// Conventions:
//
//   - Every call takes a context; every wait on a background operation has a
//     deadline (the context's, capped by the client's operation timeout).
//   - Incus error responses surface as *Error, carrying the HTTP status, the
//     message and the request that caused them, so callers branch with
//     errors.As or IsNotFound.
//   - A failed background operation is an error even though Incus answers
//     the wait with HTTP 200.
//   - Stopping an instance takes an explicit timeout: Incus treats a zero
//     timeout as a kill, so a kill is its own method.
//
// The subpackage incustest starts a private incusd for integration tests.
package incus
