package download

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/agent-dev/agent/internal/fetch"
)

type hubErrorCase struct {
	Name    string `json:"name"`
	Status  int    `json:"status"`
	Code    string `json:"code"`
	Message string `json:"message"`
}

// TestHubErrorsPassTheHubsWords replays the Hub's refusals (testdata/hub_errors.json) to
// the revision API and to a file download, with and without a token: the error quotes
// X-Error-Code and X-Error-Message and names the repository's page, and says a token is
// needed only when none was sent.
func TestHubErrorsPassTheHubsWords(t *testing.T) {
	t.Parallel()
	raw, err := os.ReadFile("testdata/hub_errors.json")
	if err != nil {
		t.Fatal(err)
	}
	var corpus struct {
		Cases []hubErrorCase `json:"cases"`
	}
	if err := json.Unmarshal(raw, &corpus); err != nil || len(corpus.Cases) == 0 {
		t.Fatalf("corpus: %v", err)
	}
	for _, tc := range corpus.Cases {
		for _, token := range []string{"", "hf_secret_token_123"} {
			name := tc.Name + "/no token"
			if token != "" {
				name = tc.Name + "/token"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				var requests atomic.Int64
				srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
					requests.Add(1)
					if tc.Code != "" {
						w.Header().Set("X-Error-Code", tc.Code)
					}
					w.Header().Set("X-Error-Message", tc.Message)
					http.Error(w, tc.Message, tc.Status)
				}))
				t.Cleanup(srv.Close)
				repoURL := srv.URL + "/org/model"
				check := func(what string, err error) {
					t.Helper()
					if err == nil {
						t.Fatalf("%s: no error", what)
					}
					msg := err.Error()
					for _, want := range []string{tc.Message, repoURL} {
						if !strings.Contains(msg, want) {
							t.Errorf("%s: %q does not say %q", what, msg, want)
						}
					}
					if tc.Code != "" && !strings.Contains(msg, tc.Code) {
						t.Errorf("%s: %q does not name the code %s", what, msg, tc.Code)
					}
					needsToken := strings.Contains(msg, "needs a token")
					if wantHint := token == "" && (tc.Status == 401 || tc.Status == 403); needsToken != wantHint {
						t.Errorf("%s: %q: 'needs a token' hint %v, want %v (token sent: %v)", what, msg, needsToken, wantHint, token != "")
					}
					if token != "" && strings.Contains(msg, token) {
						t.Errorf("%s: the error quotes the token", what)
					}
					t.Logf("%s: %s", what, msg)
				}

				hc, err := newHubClient(srv.URL, token, false)
				if err != nil {
					t.Fatal(err)
				}
				_, err = hc.resolve(t.Context(), "org/model", "main")
				check("resolve", err)

				src := &hubSource{repo: "org/model", endpoint: srv.URL}
				f := fetch.File{Name: "model.safetensors", URL: hc.fileURL("org/model", strings.Repeat("c", 40), "model.safetensors"),
					Size: 100, SHA256: strings.Repeat("a", 64)}
				if token != "" {
					f.Header = http.Header{"Authorization": {"Bearer " + token}}
				}
				before := requests.Load()
				_, err = fetch.Fetch(t.Context(), []fetch.File{f}, fetch.Options{Dest: t.TempDir(), FreeSpaceMargin: -1})
				check("download", hubFetchError(err, src, token != ""))
				if n := requests.Load() - before; tc.Status != 404 && n != 1 {
					t.Errorf("download: %d requests, want 1: a refusal is not retried", n)
				}
			})
		}
	}
}
