// Package proc holds the host's process facts, read from a procfs tree, and
// the verified kill built on them.
//
// The server resource has to prove what it claims: that the process it
// launched is still the one it launched, that a stop left nothing behind, and
// that the port is free for the next launch. Guesses such as "pkill -f sglang"
// or "the PID is gone, so it exited" are exactly what this package replaces.
// Processes are therefore named by Identity (PID plus start time in clock
// ticks), never by name, so a reused PID is never mistaken for ours and never
// signalled.
//
// Everything is read under a configurable root (FS.Root, "/proc" by default)
// so the parsers run against fake trees in tests. Container processes are
// seen in the host's /proc too, which is why one FS serves both the host and
// Incus containers. Signals, however, go by PID in the caller's own PID
// namespace, so Stop refuses a root that is not the caller's own procfs.
//
// One fact of the hosts shapes the package: PID 1 there does not reap
// orphans, so a killed process that was re-parented stays a zombie forever.
// A zombie has released its memory, its sockets and its GPU context, so it
// counts as gone.
package proc
