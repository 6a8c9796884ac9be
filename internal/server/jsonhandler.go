package server

import (
	"errors"
	"io"
	"net/http"
	"strconv"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// DefaultJSONBodyBytes is the largest /json request body JSONHandler
// accepts when given no limit: the default --max-message-bytes.
const DefaultJSONBodyBytes = 1 << 20

// JSONHandler returns the handler of envoyproxy/ratelimit's POST /json
// (src/server/server_impl.go@f2fb157), for clients that cannot speak gRPC
// (Lua filters, scripts): the body is a RateLimitRequest in protobuf's
// JSON mapping, decided exactly as ShouldRateLimit decides it (the same
// checks, the same buckets, observed alike), and the answer is the
// RateLimitResponse in the same mapping, Content-Type application/json:
//
//   - 200 OK for overall_code OK, 429 Too Many Requests for OVER_LIMIT;
//   - 400 Bad Request, text/plain, for a body that is no RateLimitRequest
//     or a request the gRPC service answers INVALID_ARGUMENT (the same
//     message);
//   - 413 Request Entity Too Large for a body over maxBodyBytes (default
//     DefaultJSONBodyBytes when not positive);
//   - 405 Method Not Allowed for a method other than POST;
//   - 503 Service Unavailable when the gRPC service answers UNAVAILABLE
//     (no config yet, the backend failed), 504 when the call's deadline
//     passed, 500 otherwise. (The incumbent answers 400 to every error.)
//
// The request's context is the call's: a client that goes away cancels it.
// The handler is safe for concurrent use; the daemon mounts it on the HTTP
// listener.
func (s *Server) JSONHandler(maxBodyBytes int) http.Handler {
	if maxBodyBytes <= 0 {
		maxBodyBytes = DefaultJSONBodyBytes
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			w.Header().Set("Allow", http.MethodPost)
			http.Error(w, "POST a RateLimitRequest as JSON", http.StatusMethodNotAllowed)
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, int64(maxBodyBytes)))
		if err != nil {
			var tooLarge *http.MaxBytesError
			if errors.As(err, &tooLarge) {
				http.Error(w, "request body is more than "+strconv.Itoa(maxBodyBytes)+" bytes", http.StatusRequestEntityTooLarge)
				return
			}
			http.Error(w, "reading the request body: "+err.Error(), http.StatusBadRequest)
			return
		}
		req := &rlsv3.RateLimitRequest{}
		if err := protojson.Unmarshal(body, req); err != nil {
			http.Error(w, "body is no RateLimitRequest in JSON: "+err.Error(), http.StatusBadRequest)
			return
		}
		resp, err := s.ShouldRateLimit(r.Context(), req)
		if err != nil {
			st := status.Convert(err)
			http.Error(w, st.Message(), httpStatusOf(st.Code()))
			return
		}
		out, err := protojson.Marshal(withMetadataDecoded(resp))
		if err != nil {
			http.Error(w, "encoding the answer: "+err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		if resp.GetOverallCode() == rlsv3.RateLimitResponse_OVER_LIMIT {
			w.WriteHeader(http.StatusTooManyRequests)
		}
		_, _ = w.Write(out)
	})
}

// httpStatusOf maps the gRPC code of a failed call to its /json status.
func httpStatusOf(c codes.Code) int {
	switch c {
	case codes.InvalidArgument:
		return http.StatusBadRequest
	case codes.Unavailable:
		return http.StatusServiceUnavailable
	case codes.DeadlineExceeded:
		return http.StatusGatewayTimeout
	}
	return http.StatusInternalServerError
}

// withMetadataDecoded returns resp with its dynamic metadata as a field:
// a one-rule answer carries it pre-encoded in its unknown fields (see
// setMetadata), which the JSON mapping leaves out. The shared bytes are
// decoded into a new message, never written.
func withMetadataDecoded(resp *rlsv3.RateLimitResponse) *rlsv3.RateLimitResponse {
	raw := resp.ProtoReflect().GetUnknown()
	if resp.DynamicMetadata != nil || len(raw) == 0 {
		return resp
	}
	var m rlsv3.RateLimitResponse
	if err := proto.Unmarshal(raw, &m); err != nil {
		return resp
	}
	resp.DynamicMetadata = m.DynamicMetadata
	resp.ProtoReflect().SetUnknown(nil)
	return resp
}
