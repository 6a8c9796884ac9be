package config

import "testing"

// TestWithRefused: Refused names a refused domain only while the set has
// none of it; the set's rules and hash are untouched.
func TestWithRefused(t *testing.T) {
	s, err := Parse([]File{{"f.yaml", []byte(domainFile("kept"))}})
	if err != nil {
		t.Fatal(err)
	}
	r := s.WithRefused(map[string]string{"kept": "old version in force", "new": "f.yaml:3:5: bad"})
	if why, ok := r.Refused("new"); !ok || why != "f.yaml:3:5: bad" {
		t.Errorf("Refused(new) = %q, %v; want the reason", why, ok)
	}
	if _, ok := r.Refused("kept"); ok {
		t.Errorf("Refused(kept) = true with a version of it in the set")
	}
	if _, ok := r.Refused("other"); ok {
		t.Errorf("Refused(other) = true for a domain nobody refused")
	}
	if _, ok := s.Refused("new"); ok {
		t.Errorf("the original set reports a refusal: WithRefused must copy")
	}
	if r.Hash() != s.Hash() || !r.HasDomain("kept") {
		t.Errorf("WithRefused changed the hash or the domains")
	}
	var nilSet *Set
	if _, ok := nilSet.Refused("new"); ok {
		t.Errorf("a nil set reports a refusal")
	}
}
