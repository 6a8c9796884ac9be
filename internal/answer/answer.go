// Package answer shows a RateLimitResponse as people and scripts read it:
// a table, or a JSON document whose shape is stable.
package answer

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// Answer is a RateLimitResponse to a request as ratelimitd check prints
// it: the overall code, one Status per descriptor, the headers and the
// dynamic metadata. Its JSON form is stable.
type Answer struct {
	OverallCode          string         `json:"overall_code"`
	Statuses             []Status       `json:"statuses"`
	ResponseHeadersToAdd []Header       `json:"response_headers_to_add,omitempty"`
	RequestHeadersToAdd  []Header       `json:"request_headers_to_add,omitempty"`
	DynamicMetadata      map[string]any `json:"dynamic_metadata,omitempty"`
}

// Status is one descriptor's status.
type Status struct {
	Descriptor   string `json:"descriptor"`
	Code         string `json:"code"`
	Limit        *Limit `json:"limit,omitempty"`
	Remaining    uint32 `json:"remaining"`
	ResetSeconds int64  `json:"reset_seconds"`
}

// Limit is a status's current limit.
type Limit struct {
	Name            string `json:"name,omitempty"`
	RequestsPerUnit uint32 `json:"requests_per_unit"`
	Unit            string `json:"unit"`
	UnitMultiplier  uint32 `json:"unit_multiplier,omitempty"`
}

// Header is one header to add.
type Header struct {
	Key   string `json:"key"`
	Value string `json:"value"`
}

// Of is resp, the answer to req, as an Answer.
func Of(req *rlsv3.RateLimitRequest, resp *rlsv3.RateLimitResponse) Answer {
	a := Answer{OverallCode: resp.GetOverallCode().String(), Statuses: []Status{}}
	for i, st := range resp.GetStatuses() {
		s := Status{Code: st.GetCode().String(), Remaining: st.GetLimitRemaining(), ResetSeconds: st.GetDurationUntilReset().GetSeconds()}
		if i < len(req.GetDescriptors()) {
			s.Descriptor = Entries(req.GetDescriptors()[i].GetEntries())
		}
		if l := st.GetCurrentLimit(); l != nil {
			s.Limit = &Limit{Name: l.GetName(), RequestsPerUnit: l.GetRequestsPerUnit(), Unit: strings.ToLower(l.GetUnit().String()),
				UnitMultiplier: l.GetUnitMultiplier().GetValue()}
		}
		a.Statuses = append(a.Statuses, s)
	}
	for _, h := range resp.GetResponseHeadersToAdd() {
		a.ResponseHeadersToAdd = append(a.ResponseHeadersToAdd, Header{h.GetKey(), h.GetValue()})
	}
	for _, h := range resp.GetRequestHeadersToAdd() {
		a.RequestHeadersToAdd = append(a.RequestHeadersToAdd, Header{h.GetKey(), h.GetValue()})
	}
	if md := resp.GetDynamicMetadata(); md != nil && len(md.GetFields()) > 0 {
		a.DynamicMetadata = md.AsMap()
	}
	return a
}

// String is the limit as "N/unit (name)", or "-" for none.
func (l *Limit) String() string {
	if l == nil {
		return "-"
	}
	per := l.Unit
	if l.UnitMultiplier > 1 {
		per = fmt.Sprintf("%d %ss", l.UnitMultiplier, l.Unit)
	}
	s := fmt.Sprintf("%d/%s", l.RequestsPerUnit, per)
	if l.Unit == "unknown" {
		// A concurrency limit: so many at once, over no period.
		s = fmt.Sprintf("%d in flight", l.RequestsPerUnit)
	}
	if l.Name != "" {
		s += " (" + l.Name + ")"
	}
	return s
}

// WriteTable prints the answer for people: the overall code, a table of
// statuses, then headers and metadata.
func (a Answer) WriteTable(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "overall: %s\n\n", a.OverallCode)
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "DESCRIPTOR\tCODE\tLIMIT\tREMAINING\tRESET")
	for _, s := range a.Statuses {
		remaining := "-"
		if s.Limit != nil {
			remaining = fmt.Sprint(s.Remaining)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%ds\n", s.Descriptor, s.Code, s.Limit, remaining, s.ResetSeconds)
	}
	tw.Flush()
	headers := func(title string, hs []Header) {
		if len(hs) == 0 {
			return
		}
		fmt.Fprintf(&b, "\n%s:\n", title)
		for _, h := range hs {
			fmt.Fprintf(&b, "  %s: %s\n", h.Key, h.Value)
		}
	}
	headers("response headers", a.ResponseHeadersToAdd)
	headers("request headers", a.RequestHeadersToAdd)
	if len(a.DynamicMetadata) > 0 {
		var md strings.Builder
		enc := json.NewEncoder(&md)
		enc.SetEscapeHTML(false) // rule paths hold '>'
		if err := enc.Encode(a.DynamicMetadata); err != nil {
			return fmt.Errorf("metadata: %w", err)
		}
		fmt.Fprintf(&b, "\ndynamic metadata: %s", md.String())
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteJSON prints the answer as indented JSON.
func (a Answer) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false) // rule paths hold '>'
	return enc.Encode(a)
}

// Entries is a descriptor's entries as key=value,key=value.
func Entries(entries []*ratelimitv3.RateLimitDescriptor_Entry) string {
	parts := make([]string, len(entries))
	for i, e := range entries {
		parts[i] = e.GetKey() + "=" + e.GetValue()
	}
	return strings.Join(parts, ",")
}
