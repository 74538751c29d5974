// Package chaos holds the crash-anywhere test of issue 9: it runs the quickstart plan
// (plus a download served locally) with `agent apply` and SIGKILLs the agent at random
// points, then checks that nothing the agent promises was broken; TestChaosRun does the
// same to `agent run`, restarted after each kill as systemd would. See chaos_test.go,
// run_test.go and docs/security.md.
package chaos
