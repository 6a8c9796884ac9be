package tlsreload_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ratelimitd/ratelimitd/internal/tlsreload"
)

// TestClientTLS: the CA and client certificate a client trusts and
// presents, and an error naming the flag for each wrong file.
func TestClientTLS(t *testing.T) {
	dir := t.TempDir()
	ca := newAuthority(t, "test CA")
	write := func(name string, b []byte) string {
		f := filepath.Join(dir, name)
		if err := os.WriteFile(f, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return f
	}
	certPEM, keyPEM := ca.issue(t, "client", false)
	caFile, cert, key := write("ca.pem", ca.PEM), write("client.pem", certPEM), write("client.key", keyPEM)
	notPEM := filepath.Join(dir, "not.pem")
	if err := os.WriteFile(notPEM, []byte("not a certificate"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing.pem")

	tests := []struct {
		name                  string
		caFile, cert, key     string
		wantErr               string
		wantRoots, wantClient bool
	}{
		{name: "system roots"},
		{name: "CA", caFile: caFile, wantRoots: true},
		{name: "CA and client certificate", caFile: caFile, cert: cert, key: key, wantRoots: true, wantClient: true},
		{name: "client certificate, system roots", cert: cert, key: key, wantClient: true},
		{name: "certificate without key", caFile: caFile, cert: cert, wantErr: "--x-cert and --x-key go together"},
		{name: "key without certificate", key: key, wantErr: "--x-cert and --x-key go together"},
		{name: "missing CA", caFile: missing, wantErr: "--x-ca: open " + missing},
		{name: "CA not PEM", caFile: notPEM, wantErr: "--x-ca " + notPEM + ": no PEM certificate in it"},
		{name: "key does not match", cert: cert, key: notPEM, wantErr: "--x-cert/--x-key: "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := tlsreload.ClientConfig("--x", tt.caFile, tt.cert, tt.key)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("ClientConfig = %v, want an error containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if (cfg.RootCAs != nil) != tt.wantRoots || (len(cfg.Certificates) == 1) != tt.wantClient {
				t.Errorf("ClientConfig: roots %v, %d client certificates; want roots %v, client %v",
					cfg.RootCAs != nil, len(cfg.Certificates), tt.wantRoots, tt.wantClient)
			}
		})
	}
}
