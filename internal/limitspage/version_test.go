package limitspage_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/ratelimitd/ratelimitd/internal/buildinfo"
	"github.com/ratelimitd/ratelimitd/internal/limitspage"
)

// TestLimitsShowsTheBuild: the page and its JSON name the build that
// serves them, and say nothing of one they were not given.
func TestLimitsShowsTheBuild(t *testing.T) {
	const rev = "4c35b9250afefede41c5f5acd76191f90f625898"
	for _, c := range []struct {
		name               string
		build              buildinfo.Info
		wantHTML, lackHTML []string
	}{
		{
			name:     "release",
			build:    buildinfo.Info{Version: "v1.2.3", Revision: rev, GoVersion: "go1.26.8"},
			wantHTML: []string{`ratelimitd <code id="version">v1.2.3</code> (<code id="revision" title="` + rev + `">4c35b9250afe</code>)`},
		},
		{
			name:     "no revision",
			build:    buildinfo.Info{Version: "(devel)"},
			wantHTML: []string{`ratelimitd <code id="version">(devel)</code></p>`},
			lackHTML: []string{`id="revision"`},
		},
		{
			name:     "none given",
			lackHTML: []string{`id="version"`, `id="revision"`},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t)
			h, err := limitspage.NewHandler(limitspage.Options{Config: f.srv.Config, Tracker: f.tracker, Now: f.clock.Now, Build: c.build})
			if err != nil {
				t.Fatal(err)
			}
			hs := mount(h)
			defer hs.Close()
			body, _ := get(t, hs, "/limits.json")
			var page struct {
				Version  *string `json:"version"`
				Revision *string `json:"revision"`
			}
			if err := json.Unmarshal([]byte(body), &page); err != nil {
				t.Fatal(err)
			}
			if got, want := deref(page.Version), c.build.Version; got != want || (want == "") != (page.Version == nil) {
				t.Errorf("/limits.json version %v %q, want %q (absent when empty)", page.Version != nil, got, want)
			}
			if got, want := deref(page.Revision), c.build.Revision; got != want || (want == "") != (page.Revision == nil) {
				t.Errorf("/limits.json revision %v %q, want %q (absent when empty)", page.Revision != nil, got, want)
			}
			html, _ := get(t, hs, "/limits")
			for _, want := range c.wantHTML {
				if !strings.Contains(html, want) {
					t.Errorf("/limits lacks %q", want)
				}
			}
			for _, lack := range c.lackHTML {
				if strings.Contains(html, lack) {
					t.Errorf("/limits has %q", lack)
				}
			}
		})
	}
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
