package envoygateway

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	routev3 "github.com/envoyproxy/go-control-plane/envoy/config/route/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/envoyproxy/go-control-plane/pkg/resource/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// routeWatch is an Envoy's view of Envoy Gateway's route config: an ADS
// stream to EG's xDS server (18000) subscribed to every
// RouteConfiguration, as the Envoy of Gateway default/eg would be
// (node.cluster is the IR key, "namespace/name": EG's snapshot cache
// serves a node the snapshot of its cluster, internal/xds/cache,
// v1.9.1). It reconnects when EG restarts. Safe for concurrent use.
type routeWatch struct {
	mu      sync.Mutex
	routes  map[string]*routev3.Route // by Envoy route name
	version string
	pushes  int
	changed chan struct{} // closed and replaced on every push
}

func watchRoutes(ctx context.Context, addr, certDir, serverName string) (*routeWatch, error) {
	creds, err := clientTLS(certDir, serverName)
	if err != nil {
		return nil, err
	}
	w := &routeWatch{routes: map[string]*routev3.Route{}, changed: make(chan struct{})}
	go func() {
		for ctx.Err() == nil {
			_ = w.stream(ctx, addr, creds) // the error is EG going away: reconnect
			select {
			case <-ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
		}
	}()
	return w, nil
}

func clientTLS(certDir, serverName string) (credentials.TransportCredentials, error) {
	cert, err := tls.LoadX509KeyPair(filepath.Join(certDir, "tls.crt"), filepath.Join(certDir, "tls.key"))
	if err != nil {
		return nil, err
	}
	ca, err := os.ReadFile(filepath.Join(certDir, "ca.crt"))
	if err != nil {
		return nil, err
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(ca) {
		return nil, fmt.Errorf("%s/ca.crt: no certificate", certDir)
	}
	return credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}, RootCAs: roots, ServerName: serverName, MinVersion: tls.VersionTLS12}), nil
}

func (w *routeWatch) stream(ctx context.Context, addr string, creds credentials.TransportCredentials) error {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds), grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(256<<20)))
	if err != nil {
		return err
	}
	defer conn.Close()
	s, err := discoveryv3.NewAggregatedDiscoveryServiceClient(conn).StreamAggregatedResources(ctx)
	if err != nil {
		return err
	}
	req := &discoveryv3.DiscoveryRequest{
		Node:    &corev3.Node{Id: "ratelimitd-conformance", Cluster: gatewayIRKey},
		TypeUrl: resource.RouteType,
	}
	for {
		if err := s.Send(req); err != nil {
			return err
		}
		resp, err := s.Recv()
		if err != nil {
			return err
		}
		routes := map[string]*routev3.Route{}
		for _, a := range resp.GetResources() {
			var rc routev3.RouteConfiguration
			if err := a.UnmarshalTo(&rc); err != nil {
				return err
			}
			for _, vh := range rc.GetVirtualHosts() {
				for _, r := range vh.GetRoutes() {
					routes[r.GetName()] = r
				}
			}
		}
		w.mu.Lock()
		w.routes, w.version = routes, resp.GetVersionInfo()
		w.pushes++
		close(w.changed)
		w.changed = make(chan struct{})
		w.mu.Unlock()
		req = &discoveryv3.DiscoveryRequest{TypeUrl: resource.RouteType, VersionInfo: resp.GetVersionInfo(), ResponseNonce: resp.GetNonce()}
	}
}

// route is the Envoy route of rule `rule` of HTTPRoute default/name (its
// first match; EG names it httproute/<ns>/<name>/rule/<i>/match/<j>/<host>).
func (w *routeWatch) route(name string, rule int) *routev3.Route {
	prefix := fmt.Sprintf("httproute/default/%s/rule/%d/match/", name, rule)
	w.mu.Lock()
	defer w.mu.Unlock()
	var best *routev3.Route
	for n, r := range w.routes {
		if strings.HasPrefix(n, prefix) && (best == nil || n < best.GetName()) {
			best = r
		}
	}
	return best
}

// waitFor waits until cond holds of the routes, up to d.
func (w *routeWatch) waitFor(d time.Duration, cond func() bool) bool {
	deadline := time.After(d)
	for {
		w.mu.Lock()
		ch := w.changed
		w.mu.Unlock()
		if cond() {
			return true
		}
		select {
		case <-ch:
		case <-deadline:
			return cond()
		case <-time.After(500 * time.Millisecond):
		}
	}
}
