package tlsreload

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
)

// ClientConfig is the TLS a client speaks, read once: trusting the CAs of
// the PEM file caFile (empty: the system's), and presenting the
// certificate certFile with its key keyFile when given (both or neither).
// flag is the common prefix of the three flags that name the files, for
// errors ("--tls" for --tls-ca, --tls-cert and --tls-key).
func ClientConfig(flag, caFile, certFile, keyFile string) (*tls.Config, error) {
	if (certFile == "") != (keyFile == "") {
		return nil, fmt.Errorf("%s-cert and %s-key go together", flag, flag)
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("%s-ca: %w", flag, err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("%s-ca %s: no PEM certificate in it", flag, caFile)
		}
	}
	if certFile != "" {
		pair, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("%s-cert/%s-key: %w", flag, flag, err)
		}
		cfg.Certificates = []tls.Certificate{pair}
	}
	return cfg, nil
}
