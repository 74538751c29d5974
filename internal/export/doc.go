// Package export observes a host and writes the plan that reproduces it: the first step
// of migrating a host (`agent export`). It only reads: /proc for model servers (SGLang,
// vLLM, llama.cpp, on the host or inside containers), the NVIDIA driver through
// internal/gpu, and the Incus REST API for instances. It never signals a process and
// never writes to Incus.
//
// Observe gathers an Observation; Render turns it into formatted HCL, checked against the same
// loader and binder `agent validate` uses: a block that would not validate (a download
// whose origin is unknown, a kind this agent cannot express yet) is written commented
// out, with the reason, so the output always validates.
package export
