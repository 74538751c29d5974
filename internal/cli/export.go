package cli

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"strconv"
	"time"

	"github.com/agent-dev/agent/internal/export"
	"github.com/agent-dev/agent/internal/gpu"
	"github.com/agent-dev/agent/internal/incus"
	"github.com/agent-dev/agent/resources"
)

// runExport is `agent export`: observe this host and print the plan that reproduces it
// (docs/export.md). It only reads; it never signals a process or writes to Incus.
func runExport(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("agent export", flag.ContinueOnError)
	fs.SetOutput(stderr)
	asJSON := fs.Bool("json", false, "the observation and the plan as JSON")
	hash := fs.Bool("hash", false, "compute the sha256 of every weights file (reads them all)")
	hostname := fs.String("hostname", "", "`NAME` the plan's host guard carries (default: this host's)")
	socket := fs.String("incus-socket", "", "`PATH` of the Incus socket (\"none\": skip containers; default: $INCUS_SOCKET, then the usual paths)")
	var ports multi
	fs.Var(&ports, "port", "`N`: export only the model servers on this port (repeatable)")
	pos, code, ok := parseArgs("export", fs, args, stdout, stderr)
	if !ok {
		return code
	}
	if len(pos) != 0 {
		fmt.Fprintf(stderr, "agent export: takes no PLAN argument (it writes one to stdout)\n")
		return exitUsage
	}
	o := export.Options{Hostname: *hostname, Hash: *hash}
	for _, p := range ports {
		n, err := strconv.Atoi(p)
		if err != nil || n <= 0 || n > 65535 {
			fmt.Fprintf(stderr, "agent export: --port %q is not a TCP port\n", p)
			return exitUsage
		}
		o.Ports = append(o.Ports, n)
	}
	if root := os.Getenv(resources.HostRootEnv); root != "" {
		o.GPU = gpu.ProcFS{Root: root}
	} else {
		o.GPU = gpu.Default("")
	}
	var notes []string
	if *socket != "none" {
		path := incus.SocketPath(*socket)
		c := incus.New(path)
		pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		_, err := c.Server(pctx)
		cancel()
		switch {
		case err == nil:
			o.Incus = c
		case *socket != "":
			fmt.Fprintf(stderr, "agent export: --incus-socket %s: %v\n", path, err)
			return ExitError
		default:
			notes = append(notes, fmt.Sprintf("containers: no Incus daemon answers at %s, so no container was exported", path))
		}
	}
	h, err := export.Observe(ctx, o)
	if err != nil {
		fmt.Fprintf(stderr, "agent export: %v\n", err)
		return ExitError
	}
	h.Notes = append(notes, h.Notes...)
	src, err := export.Render(h)
	if err != nil {
		fmt.Fprintf(stderr, "agent export: %v\n", err)
		return ExitError
	}
	if *asJSON {
		export.EmptyNotNull(h)
		out := struct {
			*export.Observation
			Plan string `json:"plan"`
		}{h, string(src)}
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(out); err != nil {
			fmt.Fprintf(stderr, "agent export: %v\n", err)
			return ExitError
		}
		return ExitOK
	}
	if _, err := stdout.Write(src); err != nil {
		fmt.Fprintf(stderr, "agent export: %v\n", err)
		return ExitError
	}
	return ExitOK
}
