// Package service installs the agent's Debian package in a Debian bookworm system
// container whose PID 1 is a real systemd, and checks agent.service as an operator meets
// it (issue 19): READY, a reload during a slow server start, a SIGKILLed agent that
// adopts its server, a watchdog restart after SIGSTOP, a plan edit that relaunches it,
// an upgrade and a stop that leave the server alone, a reload without procps, the server
// in a transient unit of its own with a writable HOME, the hardening score, a journal
// free of a planted secret, and a removal.
//
// The root filesystem comes from debootstrap (internal/incus/incustest.DebianImage,
// cached in /var/cache/agent-test) and runs in the private incusd of incustest. Without
// Incus or debootstrap the test is skipped, or fails when CI=true.
package service
