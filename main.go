// Command agent is a declarative provisioning agent for GPU inference hosts: it reads an
// HCL plan, observes the host, shows the difference and applies only what is needed, in
// dependency order, verifying every step. See README.md and docs/.
package main

import (
	"os"

	"github.com/agent-dev/agent/internal/cli"
)

func main() {
	os.Exit(cli.Main(os.Args[1:], os.Stdout, os.Stderr))
}
