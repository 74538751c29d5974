// Package plans is the plan language: HCL2 native syntax files that declare what must be
// true on a host.
//
// Loading a plan is two-phase (as Nomad's jobspec2 does): first the top level is split into
// blocks by type and label (agent, host, variable, locals, and one block type per resource
// kind), references between blocks are collected and turned into a dependency graph; then
// each resource body is decoded, in dependency order, with the schema its kind declares,
// so that `download.qwen.dest` in a container resolves to the download's value.
//
// Every problem is an hcl.Diagnostic with a source range, and loading goes on after an
// error so that one run reports all of them. The package knows nothing about what the
// resources do: kinds hand it their configuration structs (gohcl tags) through Options.
package plans
