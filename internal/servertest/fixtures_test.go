package servertest_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/internal/servertest"
)

func TestRequest(t *testing.T) {
	req := servertest.Request("api", servertest.Desc("model", "gpt-4o", "client", "a", "odd"), servertest.Desc())
	if req.GetDomain() != "api" || len(req.GetDescriptors()) != 2 {
		t.Fatalf("Request = %v, want domain api and two descriptors", req)
	}
	var got []string
	for _, e := range req.GetDescriptors()[0].GetEntries() {
		got = append(got, e.GetKey()+"="+e.GetValue())
	}
	if strings.Join(got, " ") != "model=gpt-4o client=a" || req.GetDescriptors()[0].GetHitsAddend() != nil || len(req.GetDescriptors()[1].GetEntries()) != 0 {
		t.Errorf("Request's descriptors = %v, want [model=gpt-4o client=a] without hits_addend, then an empty one", req.GetDescriptors())
	}
}

func TestParseConfig(t *testing.T) {
	set := servertest.ParseConfig(t, "api.yaml", servertest.OutcomesConfig)
	if r := set.Lookup("api", []config.Entry{{Key: "a", Value: "x"}}); r == nil || r.Name != "a" {
		t.Errorf("Lookup(api, a=x) = %+v, want rule a", r)
	}
}

func TestEntries(t *testing.T) {
	got := servertest.Entries("model", "gpt-4o", "client", "a", "odd")
	want := []config.Entry{{Key: "model", Value: "gpt-4o"}, {Key: "client", Value: "a"}}
	if !slices.Equal(got, want) {
		t.Errorf("Entries(model, gpt-4o, client, a, odd) = %v, want %v", got, want)
	}
	if got := servertest.Entries("odd"); got != nil {
		t.Errorf("Entries(odd) = %v, want nil", got)
	}
}
