package incus

import (
	"encoding/json"
	"net/http"
	"testing"
)

// FuzzDecodeResponse feeds arbitrary bytes to the envelope decoder and the
// metadata decoders built on it: they must never panic, and what they accept
// must be one of the three documented response kinds.
func FuzzDecodeResponse(f *testing.F) {
	f.Add([]byte(`{"type":"sync","status":"Success","status_code":200,"metadata":{"api_version":"1.0"}}`))
	f.Add([]byte(`{"type":"async","status":"Operation created","status_code":100,"operation":"/1.0/operations/x","metadata":{"id":"x","status_code":103}}`))
	f.Add([]byte(`{"type":"error","error":"not found","error_code":404}`))
	f.Add([]byte(`{"type":"sync","metadata":{"id":"x","status_code":400,"err":"boom","metadata":{"return":127,"output":{"1":"/1.0/instances/c/logs/o"}}}}`))
	f.Add([]byte(`not json`))
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := decodeResponse(data)
		e := errorFromBody(request{method: "GET", path: "/1.0"}, http.StatusInternalServerError, data)
		if e.Status != http.StatusInternalServerError || e.Error() == "" {
			t.Fatalf("errorFromBody: %+v", e)
		}
		if err != nil {
			return
		}
		switch r.Type {
		case typeSync:
		case typeAsync:
			if r.Operation == "" {
				t.Fatal("async without operation accepted")
			}
			if id, err := operationID(r.Operation); err == nil && id == "" {
				t.Fatal("empty operation id accepted")
			}
		case typeError:
			if r.Error == "" {
				t.Fatal("error response without message")
			}
		default:
			t.Fatalf("accepted type %q", r.Type)
		}
		var op Operation
		if r.metadata(&op) == nil {
			_ = op.Done()
			if code, paths, err := execMetadata(&op); err == nil && paths == nil {
				t.Fatalf("exec metadata: code %d with nil paths", code)
			}
		}
		var inst Instance
		_ = r.metadata(&inst)
		var st InstanceState
		_ = r.metadata(&st)
		var srv Server
		_ = r.metadata(&srv)
		// What was accepted re-encodes.
		if _, err := json.Marshal(r); err != nil {
			t.Fatalf("re-encode: %v", err)
		}
	})
}
