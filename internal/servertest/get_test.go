package servertest_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/ratelimitd/ratelimitd/internal/servertest"
)

func TestGet(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/ok" {
			http.Error(w, "nothing at "+r.URL.Path, http.StatusNotFound)
			return
		}
		w.Header().Set("X-Test", "yes")
		w.Write([]byte("fine"))
	}))
	defer srv.Close()
	tests := []struct {
		path     string
		wantCode int
		wantBody string
	}{
		{"/ok", http.StatusOK, "fine"},
		{"/missing", http.StatusNotFound, "nothing at /missing\n"},
	}
	for _, tt := range tests {
		code, body := servertest.Get(t, srv.URL+tt.path)
		if code != tt.wantCode || body != tt.wantBody {
			t.Errorf("Get(%s) = %d, %q; want %d, %q", tt.path, code, body, tt.wantCode, tt.wantBody)
		}
	}
	resp, body := servertest.GetResponse(t, srv.URL+"/ok")
	if resp.StatusCode != http.StatusOK || body != "fine" || resp.Header.Get("X-Test") != "yes" {
		t.Errorf("GetResponse(/ok) = %d, %q, X-Test %q; want 200, \"fine\", \"yes\"", resp.StatusCode, body, resp.Header.Get("X-Test"))
	}
}
