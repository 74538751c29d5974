// Package lifecycle runs one long-lived server process the way the server
// resource promises: launched detached in a session of its own, writing to a
// fresh log file per launch generation, verified alive, ready and sane before
// it counts as launched, and stopped only by a verified kill.
//
// The steps are the ones that went wrong by hand in the field report:
//
//   - Launch never reuses a log file. Generation N writes
//     <log_dir>/<name>.N.log, created with O_EXCL, and <name>.log is a symlink
//     to it, so an operator (or the agent) can never read the previous
//     server's lines as fresh ones. Older generations are kept up to keep_logs
//     and never written again.
//   - The process runs in its own session and process group (Setsid) with its
//     log file as stdout and stderr: no pipe to the agent, so restarting or
//     upgrading the agent never stops the server.
//   - A launch is verified in order: the process is alive, this generation's
//     log has grown, readiness (an HTTP 200 and/or a log line of THIS
//     generation) before the timeout, then the smoke test. A failure quotes the
//     tail of that generation's log and names the known failure in the
//     engine's dialect, SGLang, vLLM or llama.cpp (engines.DetectFailure),
//     instead of guessing.
//   - Stop is proc.Stop (signal the group, escalate to SIGKILL, prove every
//     member gone by PID and start time), then the port is proven free and the
//     GPU memory of those PIDs released (gpu.WaitReleased).
//   - The smoke test is one OpenAI chat completion with the declared sampling;
//     its verdict (expected substring, repeated n-gram share) is data, and the
//     caller decides what a failure means: the resource reports it and never
//     kills a server for it.
//
// Where the process runs is behind Place, a small interface: Local runs it on
// this machine; Incus starts it inside an Incus instance with one exec, finds
// it in the host's /proc (its processes are seen there with host PIDs), reads
// its log through /proc/<init>/root and its ports in the container's network
// namespace, so the rest of the lifecycle is the same code for both.
package lifecycle
