package resources

import (
	"errors"

	"github.com/agent-dev/agent/agent"
	"github.com/agent-dev/agent/internal/lifecycle"
	"github.com/agent-dev/agent/internal/proc"
	"github.com/agent-dev/agent/internal/state"
)

// The questions one kind asks of what another recorded, in one place and read-only: a
// kind reads its own record through env.State, and another's only through these, over
// the store's read-only view (state.View). Each question names both sides; a record that
// cannot be read is passed over, and where the records cannot be listed at all the
// caller gets the answer that keeps the host safe.
//
//   - liveInstance (server asks container): the instance a server must run in now.
//   - serversIn (container asks server): whether a migration would interrupt a server.
//   - recordedElsewhere (server asks server): whether another record names a process.
//   - serverRecords (driver asks server, through Machine.StopGPUServers): the servers to
//     stop before a driver change.

// liveInstance is, for a server in the instance the plan names name, the instance it
// must run in now and the one retiring from a migration ("" when none), from the record
// of the container block that manages name (container_migrate.go). Without one, name
// itself.
func liveInstance(env *agent.Env, name string) (live, retiring string) {
	live = name
	eachRecord(env, "container", func(_ string, rec containerRecord) bool {
		if rec.Base != name {
			return true
		}
		if rec.Instance == pairName(name, name) {
			live = rec.Instance
		}
		retiring = rec.Retiring
		return false
	})
	return live, retiring
}

// serversIn reports whether a server the agent launched (and has not stopped for good)
// runs in the instance, by the servers' records: what a migration must not interrupt.
// Unknown (no records to read) is true: make before break, the safe way.
func serversIn(env *agent.Env, instance string) bool {
	found := false
	ok := eachRecord(env, "server", func(_ string, rec serverRecord) bool {
		found = rec.StoppedAt.IsZero() && (rec.PID > 0 || rec.Pending != nil) && rec.Place == lifecycle.IncusPlace(instance)
		return !found
	})
	return found || !ok
}

// recordedElsewhere names another server record (not stopped) that holds the process
// st: a server never adopts what another record names, so two records never name one PID.
func recordedElsewhere(env *agent.Env, st *proc.Stat) string {
	holder := ""
	eachRecord(env, "server", func(addr string, rec serverRecord) bool {
		if rec.StoppedAt.IsZero() && rec.PID == st.PID && rec.StartTicks == st.StartTicks {
			holder = addr
		}
		return holder == ""
	})
	return holder
}

// namedServer is a server's record with its address.
type namedServer struct {
	addr string
	rec  serverRecord
}

// serverRecords is every server record of records (nil: none), for the stop of the
// servers that hold the GPUs before a driver change (gpu_stopper.go). A record that
// cannot be read is an error beside the others, never a reason to skip the rest.
func serverRecords(records *state.View) ([]namedServer, error) {
	if records == nil {
		return nil, nil
	}
	addrs, err := records.List("server")
	if err != nil {
		return nil, err
	}
	var out []namedServer
	var errs []error
	for _, addr := range addrs {
		var rec serverRecord
		if ok, err := records.Load(addr, &rec); err != nil {
			errs = append(errs, err)
			continue
		} else if ok {
			out = append(out, namedServer{addr, rec})
		}
	}
	return out, errors.Join(errs...)
}

// eachRecord calls fn with every other record of kind, decoded as T, until fn returns
// false. It reports false when the records could not be listed (or env has no state):
// the caller then does not know, and must choose the safe answer itself.
func eachRecord[T any](env *agent.Env, kind string, fn func(addr string, rec T) bool) bool {
	if env == nil || env.State == nil {
		return false
	}
	others := env.State.Others()
	addrs, err := others.List(kind)
	if err != nil {
		return false
	}
	for _, addr := range addrs {
		var rec T
		if ok, err := others.Load(addr, &rec); err != nil || !ok {
			continue
		}
		if !fn(addr, rec) {
			break
		}
	}
	return true
}
