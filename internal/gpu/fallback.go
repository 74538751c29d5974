package gpu

import (
	"context"
)

// fallback asks primary (NVML) first and procfs when primary cannot answer.
//
//   - primary says OK or no GPU: its Info is the answer.
//   - primary says no library: procfs answers on its own (Source "procfs"),
//     with the NVML detail kept in StateDetail.
//   - primary says anything else (no driver, no permission, version
//     mismatch, error): the State stays primary's, since that is the verdict
//     that matters, but the data comes from procfs (Source "procfs"), so a
//     version mismatch still reports the loaded module's version and GPUs.
type fallback struct {
	primary Observer
	procfs  Observer
}

func (f fallback) Observe(ctx context.Context) (Info, error) {
	p, err := f.primary.Observe(ctx)
	if err != nil {
		return Info{}, err
	}
	if p.State == StateOK || p.State == StateNoGPU {
		return p, nil
	}
	q, err := f.procfs.Observe(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return Info{}, err
		}
		p.StateDetail = join(p.StateDetail, "procfs: "+err.Error())
		return p, nil
	}
	if p.State != StateNoLibrary {
		if q.State != StateOK {
			q.StateDetail = join("procfs: "+q.State.String(), q.StateDetail)
		}
		q.State = p.State
	}
	q.StateDetail = join(p.StateDetail, q.StateDetail)
	return q, nil
}

func join(a, b string) string {
	switch {
	case a == "":
		return b
	case b == "":
		return a
	}
	return a + "; " + b
}
