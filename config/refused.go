package config

import "maps"

// WithRefused returns a copy of s that also records domains whose config
// the source refused, each with the reason: a domain of an xDS push that
// could not be loaded while the rest of the push was. s keeps, for such a
// domain, the last config of it that loaded, if any; Refused tells a
// caller which domains have none, so that their requests are not answered
// as for a domain nobody configured. The copy shares s's rules; refused
// is copied. The Hash is s's (it is of the files loaded).
func (s *Set) WithRefused(refused map[string]string) *Set {
	if s == nil {
		s = &Set{}
	}
	c := *s
	c.refused = nil
	if len(refused) > 0 {
		c.refused = maps.Clone(refused)
	}
	return &c
}

// Refused reports whether domain's config was refused (see WithRefused)
// and s holds none of it, with the reason given.
func (s *Set) Refused(domain string) (reason string, ok bool) {
	if s == nil || s.domains[domain] != nil {
		return "", false
	}
	reason, ok = s.refused[domain]
	return reason, ok
}
