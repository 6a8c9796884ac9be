package config_test

import (
	"fmt"

	"github.com/ratelimitd/ratelimitd/config"
)

func ExampleParse() {
	_, err := config.Parse([]config.File{{Name: "limits/ai.yaml", Data: []byte(`
domain: ai-gateway
descriptors:
  - key: model
    value: gpt-4o
    rate_limit:
      unit: minutes
      requests_per_unit: -5
      burts: 50
`)}})
	fmt.Println(err)
	// Output:
	// limits/ai.yaml:7:13: ai-gateway > model=gpt-4o: rate_limit.unit: unknown unit "minutes" (want second, minute, hour, day, week, month or year)
	// limits/ai.yaml:8:26: ai-gateway > model=gpt-4o: rate_limit.requests_per_unit: must be at least 1, got -5
	// limits/ai.yaml:9:7: ai-gateway > model=gpt-4o: rate_limit: unknown field "burts" (did you mean "burst"? valid: unit, requests_per_unit, unlimited, name, replaces, burst, unit_multiplier, counts, overdraft, max_wait, max_waiters)
}

func ExampleSet_Lookup() {
	set, err := config.Parse([]config.File{{Name: "ai.yaml", Data: []byte(`
domain: ai-gateway
descriptors:
  - key: model
    value: gpt-4o
    rate_limit: {unit: minute, requests_per_unit: 500, burst: 50}
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 10, unit_multiplier: 5}
  - key: model
    value: gpt-4*
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: model
    rate_limit: {unit: second, requests_per_unit: 1}
`)}})
	if err != nil {
		panic(err)
	}
	for _, entries := range [][]config.Entry{
		{{Key: "model", Value: "gpt-4o"}},
		{{Key: "model", Value: "gpt-4.1"}},
		{{Key: "model", Value: "o3"}},
		{{Key: "model", Value: "gpt-4o"}, {Key: "user", Value: "bob"}},
		{{Key: "user", Value: "bob"}},
	} {
		if r := set.Lookup("ai-gateway", entries); r != nil {
			fmt.Printf("%v: %s, %v\n", entries, r.Path, r.Limits[0].Limit)
		} else {
			fmt.Printf("%v: no rule\n", entries)
		}
	}
	// Output:
	// [{model gpt-4o}]: ai-gateway > model=gpt-4o, 500/1m0s burst 50
	// [{model gpt-4.1}]: ai-gateway > model=gpt-4*, 100/1m0s burst 100
	// [{model o3}]: ai-gateway > model, 1/1s burst 1
	// [{model gpt-4o} {user bob}]: ai-gateway > model=gpt-4o > user, 10/5m0s burst 10
	// [{user bob}]: no rule
}

func ExampleSet_Explain() {
	set, err := config.Parse([]config.File{{Name: "ai.yaml", Data: []byte(`
domain: ai
descriptors:
  - key: model
    value: gpt-4o
    descriptors:
      - key: user
        rate_limit: {unit: minute, requests_per_unit: 10, name: per-user}
`)}})
	if err != nil {
		panic(err)
	}
	for _, line := range set.Explain("ai", []config.Entry{{Key: "model", Value: "gpt-4o"}, {Key: "user", Value: "bob"}}) {
		fmt.Println(line)
	}
	for _, line := range set.Explain("ai", []config.Entry{{Key: "model", Value: "gpt-4o"}, {Key: "tier", Value: "gold"}}) {
		fmt.Println(line)
	}
	// Output:
	// domain ai (ai.yaml)
	// model=gpt-4o: exact value matched [ai.yaml:4]
	// user=bob: key-only rule matched (own bucket per value) [ai.yaml:7]
	// rule ai > model=gpt-4o > user (name "per-user"): 10 per minute, burst 10
	// domain ai (ai.yaml)
	// model=gpt-4o: exact value matched [ai.yaml:4]
	// no rule for tier=gold under ai > model=gpt-4o: no descriptor has key tier (keys here: user)
}

func ExampleRule_StatKey() {
	set, err := config.Parse([]config.File{{Name: "ai.yaml", Data: []byte(`
domain: ai
descriptors:
  - key: files
    value: files/*
    share_threshold: true
    rate_limit: {unit: hour, requests_per_unit: 10}
  - key: route
    value_to_metric: true
    descriptors:
      - key: user
        quota_mode: true
        metadata: {backend: primary}
        rate_limit: {unit: minute, requests_per_unit: 5}
`)}})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, entries := range [][]config.Entry{
		{{Key: "files", Value: "files/a.txt"}},
		{{Key: "route", Value: "chat"}, {Key: "user", Value: "bob"}},
	} {
		r := set.Lookup("ai", entries)
		fmt.Println(r.StatKey(entries), r.SharesBucket(), r.QuotaMode, r.Metadata)
	}
	// Output:
	// ai.files_files/* true false map[]
	// ai.route_chat.user false true map[backend:primary]
}
