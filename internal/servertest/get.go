package servertest

import (
	"io"
	"net/http"
	"testing"
)

// Get returns the status code and body of a GET of url (an HTTP endpoint
// of the server or process under test: /metrics, /limits, /readyz). It
// fails the test if the request or the reading of the body fails.
func Get(t testing.TB, url string) (int, string) {
	t.Helper()
	resp, body := GetResponse(t, url)
	return resp.StatusCode, body
}

// GetResponse is Get for a test that reads the headers too: it returns
// the response, its body already read (returned as a string) and closed.
func GetResponse(t testing.TB, url string) (*http.Response, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	return resp, string(body)
}
