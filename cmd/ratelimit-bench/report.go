package main

import (
	"fmt"
	"io"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
)

// report is what the load and run commands print.
type report struct {
	Settings settings `json:"settings"`
	Results  []Result `json:"results"`
}

// settings record how the results were measured.
type settings struct {
	DurationSec    float64 `json:"duration_sec"`
	WarmupSec      float64 `json:"warmup_sec"`
	Rounds         int     `json:"rounds"`
	Conns          int     `json:"grpc_connections"`
	Keyspace       int     `json:"keyspace"`
	OverLimitShare float64 `json:"over_limit_share"`
	ZipfS          float64 `json:"zipf_s"`
	MaxRequests    int     `json:"max_requests"`
	CPUs           int     `json:"cpus"`
	GoVersion      string  `json:"go_version"`
	OS             string  `json:"os"`
}

func settingsOf(o loadOptions, rounds int) settings {
	return settings{
		DurationSec:    o.duration.Seconds(),
		WarmupSec:      o.warmup.Seconds(),
		Rounds:         rounds,
		Conns:          o.conns,
		Keyspace:       o.mix.keyspace,
		OverLimitShare: o.mix.overLimitShare,
		ZipfS:          o.mix.zipfS,
		MaxRequests:    o.maxRequests,
		CPUs:           runtime.NumCPU(),
		GoVersion:      runtime.Version(),
		OS:             runtime.GOOS + "/" + runtime.GOARCH,
	}
}

// writeTable prints the report as an aligned table. Ratios are to the
// floor measured in the same run; "-" where there is none.
func writeTable(w io.Writer, rep report) error {
	s := rep.Settings
	fmt.Fprintf(w, "%gs per cell after %gs warm-up, median of %d round(s); %d gRPC connection(s); keyspace %d, Zipf s=%g, %.0f%% aimed over limit; %d CPUs, %s\n",
		s.DurationSec, s.WarmupSec, s.Rounds, s.Conns, s.Keyspace, s.ZipfS, 100*s.OverLimitShare, s.CPUs, s.GoVersion)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "case\ttarget\tdecisions/s\t×floor\tp50\t×floor\tp99\t×floor\tp99.9\tOK\tOVER_LIMIT\terrors\tscripts/dec\tredis cmds/dec\tround trips/dec\tredis CPU µs/dec\t")
	ratio := func(v float64) string {
		if v == 0 {
			return "-"
		}
		return strconv.FormatFloat(v, 'f', 2, 64)
	}
	for _, r := range rep.Results {
		scripts, cmds, rts, cpu := "-", "-", "-", "-"
		if r.Redis != nil {
			cpu = strconv.FormatFloat(r.Redis.CPUMicrosPerDecision, 'f', 1, 64)
			scripts = strconv.FormatFloat(r.Redis.ScriptsPerDecision, 'f', 3, 64)
			cmds = strconv.FormatFloat(r.Redis.CommandsPerDecision, 'f', 3, 64)
			rts = strconv.FormatFloat(r.Redis.RoundTripsPerDecision, 'f', 3, 64)
		}
		errs := strconv.FormatInt(r.Errors, 10)
		if len(r.ErrorKind) > 0 {
			var kinds []string
			for k, n := range r.ErrorKind {
				kinds = append(kinds, fmt.Sprintf("%s:%d", k, n))
			}
			slices.Sort(kinds)
			errs += " (" + strings.Join(kinds, ",") + ")"
		}
		capped := ""
		if r.Capped {
			capped = "*"
		}
		fmt.Fprintf(tw, "%s\t%s\t%.0f%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\t%s\t%s\t\n",
			r.Case, r.Target, r.DecisionsPerSec, capped, ratio(r.ThroughputVsFloor),
			durationString(r.P50us), ratio(r.P50VsFloor), durationString(r.P99us), ratio(r.P99VsFloor),
			durationString(r.P999us), r.OK, r.OverLimit, errs, scripts, cmds, rts, cpu)
	}
	if err := tw.Flush(); err != nil {
		return fmt.Errorf("write table: %w", err)
	}
	for _, r := range rep.Results {
		if r.Capped {
			fmt.Fprintln(w, "* --max-requests ended the phase before --duration")
			break
		}
	}
	return nil
}
