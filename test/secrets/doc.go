// Package secrets holds the planted-secret test of issue 9 (point 3): a sensitive
// variable and a Hub token must appear nowhere the agent writes or serves. See
// secrets_test.go and docs/security.md.
package secrets
