package xdstest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// ServerName is the DNS name in the server certificate of NewCerts (with
// "localhost" and the loopback addresses).
const ServerName = "xds.test"

// CA is a certificate authority made for one test.
type CA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	// File is the CA certificate as a PEM file.
	File string
	// PEM is the CA certificate, PEM-encoded (File's content).
	PEM []byte
}

// Certs are the files of a mutual-TLS setup: a CA, a server certificate
// for ServerName and the loopback addresses, and a client certificate
// with the common name "ratelimitd-1", all signed by the CA.
type Certs struct {
	CA                    *CA
	ServerCert, ServerKey string
	ClientCert, ClientKey string
}

// NewCerts makes a CA and its server and client certificates, and writes
// them to a temporary directory of the test.
func NewCerts(t testing.TB) *Certs {
	t.Helper()
	dir := t.TempDir()
	ca := NewCA(t, dir, "xdstest CA")
	c := &Certs{
		CA:         ca,
		ServerCert: filepath.Join(dir, "server.pem"), ServerKey: filepath.Join(dir, "server.key"),
		ClientCert: filepath.Join(dir, "client.pem"), ClientKey: filepath.Join(dir, "client.key"),
	}
	ca.Issue(t, "xds management server", true, c.ServerCert, c.ServerKey)
	ca.Issue(t, "ratelimitd-1", false, c.ClientCert, c.ClientKey)
	return c
}

// NewCA makes a self-signed CA named name and writes its certificate to
// dir/<name>.pem. A second call makes an unrelated CA: certificates of one
// do not verify against the other.
func NewCA(t testing.TB, dir, name string) *CA {
	t.Helper()
	tmpl := template(t, name)
	tmpl.IsCA, tmpl.BasicConstraintsValid = true, true
	tmpl.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature
	der, key := sign(t, tmpl, nil, nil)
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, safeName(name)+".pem")
	writePEM(t, file, "CERTIFICATE", der)
	return &CA{cert: cert, key: key, File: file, PEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// Pool is a pool of the CA's certificate alone, to trust it.
func (ca *CA) Pool() *x509.CertPool {
	pool := x509.NewCertPool()
	pool.AddCert(ca.cert)
	return pool
}

// Issue signs a certificate with the common name cn, for a server
// (ServerName, localhost, 127.0.0.1, ::1) or a client, valid from an hour
// ago for a day, and writes it and its key to certFile and keyFile,
// replacing what is there (the key is written first, then the
// certificate, each by renaming a complete file, as a secret volume update
// would leave them).
func (ca *CA) Issue(t testing.TB, cn string, server bool, certFile, keyFile string) {
	t.Helper()
	tmpl := template(t, cn)
	der, keyDER := ca.sign(t, tmpl, server)
	writePEM(t, keyFile, "PRIVATE KEY", keyDER)
	writePEM(t, certFile, "CERTIFICATE", der)
}

// IssuePEM is Issue for a certificate valid from notBefore to notAfter,
// returned PEM-encoded with its key rather than written.
func (ca *CA) IssuePEM(t testing.TB, cn string, server bool, notBefore, notAfter time.Time) (certPEM, keyPEM []byte) {
	t.Helper()
	tmpl := template(t, cn)
	tmpl.NotBefore, tmpl.NotAfter = notBefore, notAfter
	der, keyDER := ca.sign(t, tmpl, server)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
}

// sign sets tmpl's uses, for a server or a client, and signs it with a new
// key; it returns the certificate's DER and the key's (PKCS #8).
func (ca *CA) sign(t testing.TB, tmpl *x509.Certificate, server bool) (der, keyDER []byte) {
	t.Helper()
	tmpl.KeyUsage = x509.KeyUsageDigitalSignature
	tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.DNSNames = []string{ServerName, "localhost"}
		tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
	}
	der, key := sign(t, tmpl, ca.cert, ca.key)
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return der, keyDER
}

// ServerConfig is the server side of c as Envoy Gateway serves xDS: TLS
// 1.3 at least, a client certificate signed by c.CA required.
func (c *Certs) ServerConfig() (*tls.Config, error) {
	pair, err := tls.LoadX509KeyPair(c.ServerCert, c.ServerKey)
	if err != nil {
		return nil, fmt.Errorf("server certificate: %w", err)
	}
	return &tls.Config{
		MinVersion:   tls.VersionTLS13,
		Certificates: []tls.Certificate{pair},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    c.CA.Pool(),
		NextProtos:   []string{"h2"},
	}, nil
}

// template is a certificate for the common name cn, valid from an hour
// ago for a day, with a fresh serial number; the caller sets its uses.
func template(t testing.TB, cn string) *x509.Certificate {
	t.Helper()
	return &x509.Certificate{
		SerialNumber: serial(t),
		Subject:      pkix.Name{CommonName: cn},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
	}
}

// sign makes a P-256 key and the certificate tmpl for it, signed by parent
// with parentKey, or self-signed when parent is nil, and returns the
// certificate's DER and the key.
func sign(t testing.TB, tmpl, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) ([]byte, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	if parent == nil {
		parent, parentKey = tmpl, key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
	if err != nil {
		t.Fatal(err)
	}
	return der, key
}

func serial(t testing.TB) *big.Int {
	n, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 62))
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func writePEM(t testing.TB, file, typ string, der []byte) {
	t.Helper()
	tmp := file + ".tmp"
	if err := os.WriteFile(tmp, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, file); err != nil {
		t.Fatal(err)
	}
}

func safeName(s string) string {
	b := []byte(s)
	for i, c := range b {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-') {
			b[i] = '-'
		}
	}
	return string(b)
}
