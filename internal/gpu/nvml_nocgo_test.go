//go:build !cgo

package gpu

import (
	"context"
	"testing"
)

// Without cgo, Default is ProcFS under the root.
func TestDefaultWithoutCgo(t *testing.T) {
	t.Parallel()
	got, err := Default(rootFS(t, "a6000x2")).Observe(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if got.Source != SourceProcFS || got.State != StateOK || len(got.GPUs) != 2 {
		t.Errorf("Default(...).Observe = %+v, want the a6000x2 tree through procfs", got)
	}
}
