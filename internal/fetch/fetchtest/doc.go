// Package fetchtest serves in-memory files over HTTP for the download engine's tests, with
// byte ranges, ETags and faults injected per path: a dropped connection, a server that
// ignores ranges, content that changes between requests, a body shorter than it claims, wrong
// bytes, a stall, gzip, a redirect to a second host and Authorization checks. It counts the
// requests and body bytes it sends per path so tests can assert how much was fetched again.
package fetchtest
