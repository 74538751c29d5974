// Package state keeps what the agent launched and verified, under --state-dir
// (default /var/lib/agent, mode 0700), and the lock that lets only one agent act on a
// host at a time.
//
// State is a record of facts the agent proved (a server's PID, its start time, its launch
// generation), never a cache of desired configuration: every run observes the host again
// and uses state only to recognise what it started. Each resource has its own JSON file,
// written atomically, so a crash leaves either the old record or the new one.
package state
