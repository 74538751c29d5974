// Package fetchtest serves in-memory files over HTTP for the download engine's tests, with
// byte ranges, ETags and faults injected per path: a dropped connection, a server that
// ignores ranges, content that changes between requests, a body shorter than it claims, wrong
// bytes, a stall, gzip, a redirect to a second host and Authorization checks, HEAD refused
// or answered without a length, and a CDN's manners: a per-connection rate cap, a congested
// connection (the first ones paced far below the others), a delayed first byte, ranges cut
// short, 429/503 with Retry-After, and signed URLs that expire. It counts the requests and
// body bytes it sends per path so tests can assert how much was fetched again.
package fetchtest
