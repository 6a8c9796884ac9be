package limitspage

import (
	"bytes"
	"embed"
	"encoding/json"
	"fmt"
	"html/template"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/ratelimitd/ratelimitd/config"
	"github.com/ratelimitd/ratelimitd/internal/buildinfo"
	"github.com/ratelimitd/ratelimitd/internal/server"
)

//go:embed limits.html
var templates embed.FS

var pageTemplate = template.Must(template.New("limits.html").ParseFS(templates, "limits.html"))

// Options configures a Handler. Config and Tracker are required.
type Options struct {
	// Config returns the config in force (server.Server.Config); nil
	// before one is loaded.
	Config func() *config.Set
	// Source, when set, says where the config in force came from: "file"
	// or "xds", and for xds the management server's version of it.
	Source func() (kind, version string)
	// Tracker supplies the traffic.
	Tracker *Tracker
	// Now is the clock the page is computed at; default time.Now.
	Now func() time.Time
	// TopBuckets is how many busiest buckets to show; default 10.
	TopBuckets int
	// Pools, when set, lists the concurrency pools with leases held, the
	// fullest first, at most n (server.Server.LeasePools): the page
	// shows the TopBuckets fullest.
	Pools func(n int) []server.PoolInFlight
	// Build is the ratelimitd serving the page (buildinfo.Get()), whose
	// version and revision it shows; the zero value shows none.
	Build buildinfo.Info
}

// Handler serves GET /limits (HTML) and GET /limits.json. Mount it on both
// paths; it is safe for concurrent use.
type Handler struct {
	opts Options
}

// NewHandler returns a Handler.
func NewHandler(opts Options) (*Handler, error) {
	if opts.Config == nil || opts.Tracker == nil {
		return nil, fmt.Errorf("limitspage: Options.Config and Options.Tracker are required")
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.TopBuckets <= 0 {
		opts.TopBuckets = 10
	}
	return &Handler{opts: opts}, nil
}

// Page is what /limits shows and /limits.json returns.
type Page struct {
	// Version and Revision are the build of ratelimitd that computed the
	// page (buildinfo.Info's); "" when not known.
	Version  string `json:"version,omitempty"`
	Revision string `json:"revision,omitempty"`
	// GeneratedAt is when the page was computed.
	GeneratedAt time.Time `json:"generated_at"`
	// ConfigHash identifies the config in force ("" when none is).
	ConfigHash string `json:"config_hash"`
	// ConfigSource is where the config came from ("file", "xds"; "" when
	// unknown), ConfigVersion its xDS version.
	ConfigSource  string `json:"config_source,omitempty"`
	ConfigVersion string `json:"config_version,omitempty"`
	// WindowSeconds is the span of every rule's LastMinute.
	WindowSeconds int `json:"window_seconds"`
	// Domains lists every configured domain, by name.
	Domains []DomainPage `json:"domains"`
	// Busiest lists the fullest buckets now, fullest first.
	Busiest []BucketState `json:"busiest"`
	// InFlight lists the concurrency pools with the most leases held,
	// fullest first (at most TopBuckets).
	InFlight []PoolState `json:"in_flight,omitempty"`
	// Refresh, when positive, makes the HTML page reload itself every
	// Refresh seconds (?refresh=N).
	Refresh int `json:"-"`
}

// DomainPage is one domain of a Page.
type DomainPage struct {
	Name  string     `json:"name"`
	Files []string   `json:"files"`
	Rules []RulePage `json:"rules"`
}

// RulePage is one rule of a Page.
type RulePage struct {
	// Name is rate_limit.name ("" if none); Path the descriptor path;
	// Label what metrics and logs call the rule (config.Rule.Label).
	Name  string `json:"name"`
	Path  string `json:"path"`
	Label string `json:"label"`
	// Rate reads like "600 per minute" or "unlimited".
	Rate string `json:"rate"`
	// RequestsPerUnit, Unit and UnitMultiplier are the rate as configured;
	// Burst the bucket size (0 for unlimited and deny-all rules).
	RequestsPerUnit int64  `json:"requests_per_unit"`
	Unit            string `json:"unit"`
	UnitMultiplier  int64  `json:"unit_multiplier"`
	Burst           int64  `json:"burst"`
	ShadowMode      bool   `json:"shadow_mode"`
	Unlimited       bool   `json:"unlimited"`
	DenyAll         bool   `json:"deny_all"`
	DetailedMetric  bool   `json:"detailed_metric"`
	// File and Line locate the rule.
	File string `json:"file"`
	Line int    `json:"line"`
	// LastMinute is the rule's traffic over the last WindowSeconds.
	LastMinute Counts `json:"last_minute"`
}

// Build computes the page at now.
func (h *Handler) Build(now time.Time) Page {
	set := h.opts.Config()
	p := Page{Version: h.opts.Build.Version, Revision: h.opts.Build.Revision, GeneratedAt: now, ConfigHash: set.Hash(), WindowSeconds: int(Window / time.Second),
		Domains: []DomainPage{}, Busiest: h.opts.Tracker.Busiest(h.opts.TopBuckets, now), InFlight: h.pools(h.opts.TopBuckets)}
	if h.opts.Source != nil {
		p.ConfigSource, p.ConfigVersion = h.opts.Source()
	}
	for _, d := range set.Domains() {
		dp := DomainPage{Name: d.Name, Files: d.Files, Rules: make([]RulePage, 0, len(d.Rules))}
		for _, r := range d.Rules {
			var first config.RateLimit // the page shows the first rate; an unlimited rule has none
			if len(r.Limits) > 0 {
				first = r.Limits[0]
			}
			dp.Rules = append(dp.Rules, RulePage{
				Name: r.Name, Path: r.Path, Label: r.Label(), Rate: rate(r),
				RequestsPerUnit: first.Limit.Count, Unit: first.Unit.String(), UnitMultiplier: first.UnitMultiplier, Burst: first.Limit.Burst,
				ShadowMode: r.ShadowMode, Unlimited: r.Kind == config.KindUnlimited, DenyAll: r.Kind == config.KindDenyAll, DetailedMetric: r.DetailedMetric,
				File: r.File, Line: r.Line,
				LastMinute: h.opts.Tracker.LastMinute(r.Path, now),
			})
		}
		p.Domains = append(p.Domains, dp)
	}
	return p
}

// rate sums a rule's rates up for people: "600 per minute", "200000
// tokens per minute (overdraft 400000)", "500 per minute (group azure)",
// several joined by "; ".
func rate(r *config.Rule) string {
	switch r.Kind {
	case config.KindUnlimited:
		return "unlimited"
	case config.KindDenyAll:
		return "denies all (0 per " + r.Limits[0].Unit.String() + ")"
	case config.KindConcurrency:
		if r.Concurrency != nil {
			return r.Concurrency.String()
		}
	}
	parts := make([]string, len(r.Limits))
	for i, l := range r.Limits {
		what := ""
		if l.Counts == config.Tokens {
			what = " tokens"
		}
		per := l.Unit.String()
		if l.UnitMultiplier > 1 {
			per = fmt.Sprintf("%d %ss", l.UnitMultiplier, l.Unit)
		}
		s := fmt.Sprintf("%d%s per %s", l.Limit.Count, what, per)
		var notes []string
		if l.Group != "" {
			notes = append(notes, "group "+l.Group)
		}
		if l.Limit.MaxDebt > 0 {
			notes = append(notes, fmt.Sprintf("overdraft %d", l.Limit.MaxDebt))
		}
		if l.MaxWait > 0 {
			notes = append(notes, "waits up to "+l.MaxWait.String())
		}
		if len(notes) > 0 {
			s += " (" + strings.Join(notes, ", ") + ")"
		}
		parts[i] = s
	}
	return strings.Join(parts, "; ")
}

// contentSecurityPolicy is the page's (and the JSON's): no scripts, no
// loads from anywhere, the page's inline <style>, no framing.
const contentSecurityPolicy = "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// ServeHTTP serves the page as JSON when the path ends in ".json" or the
// query has format=json, else as HTML.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	p := h.Build(h.opts.Now())
	w.Header().Set("Cache-Control", "no-store")
	// The page and the JSON carry values from requests: no browser may
	// take them for another type than the one declared (a value that looks
	// like HTML, served as JSON, must not render).
	w.Header().Set("X-Content-Type-Options", "nosniff")
	// Nothing but its own inline style runs or loads, and no other site
	// frames it.
	w.Header().Set("Content-Security-Policy", contentSecurityPolicy)
	if r.URL.Query().Get("format") == "json" || len(r.URL.Path) > 5 && r.URL.Path[len(r.URL.Path)-5:] == ".json" {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		if err := enc.Encode(p); err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
		}
		return
	}
	if n, err := strconv.Atoi(r.URL.Query().Get("refresh")); err == nil && n > 0 {
		p.Refresh = max(n, 1)
	}
	var buf bytes.Buffer
	if err := pageTemplate.Execute(&buf, p); err != nil {
		http.Error(w, fmt.Sprintf("render /limits: %v", err), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Write(buf.Bytes())
}
