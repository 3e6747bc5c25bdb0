package proto

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/internal/check"
)

// testPKI writes a CA and certificates it signed for the server
// ("127.0.0.1") and a client into dir.
type testPKI struct {
	ca, serverCert, serverKey, clientCert, clientKey string
}

func newTestPKI(t testing.TB) testPKI {
	t.Helper()
	dir := t.TempDir()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	check.NoError(t, err)
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "kiln test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	check.NoError(t, err)
	caCert, err := x509.ParseCertificate(caDER)
	check.NoError(t, err)

	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		check.NoError(t, os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600))
		return p
	}
	leaf := func(name string, serial int64, usage x509.ExtKeyUsage) (string, string) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		check.NoError(t, err)
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial),
			Subject:      pkix.Name{CommonName: name},
			NotBefore:    time.Now().Add(-time.Hour),
			NotAfter:     time.Now().Add(time.Hour),
			KeyUsage:     x509.KeyUsageDigitalSignature,
			ExtKeyUsage:  []x509.ExtKeyUsage{usage},
			IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
		check.NoError(t, err)
		kder, err := x509.MarshalECPrivateKey(key)
		check.NoError(t, err)
		return write(name+".crt", "CERTIFICATE", der), write(name+".key", "EC PRIVATE KEY", kder)
	}
	p := testPKI{ca: write("ca.crt", "CERTIFICATE", caDER)}
	p.serverCert, p.serverKey = leaf("server", 2, x509.ExtKeyUsageServerAuth)
	p.clientCert, p.clientKey = leaf("client", 3, x509.ExtKeyUsageClientAuth)
	return p
}

func TestMutualTLS(t *testing.T) {
	pki := newTestPKI(t)
	srvTLS, err := TLSConfig{CertFile: pki.serverCert, KeyFile: pki.serverKey, CAFile: pki.ca}.Server()
	check.NoError(t, err)
	check.Equal(t, srvTLS.ClientAuth, tls.RequireAndVerifyClientCert)

	logs := newLogSink(t)
	srv := NewServer(ServerConfig{Token: "tok", Logger: logs.logger()})
	basicHandlers(srv)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	check.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ctx, tls.NewListener(ln, srvTLS)) }()
	defer func() {
		cancel()
		check.NoError(t, <-served)
	}()
	addr := ln.Addr().String()
	dctx, dcancel := context.WithTimeout(context.Background(), guard)
	defer dcancel()

	t.Run("mutual", func(t *testing.T) {
		cliTLS, err := TLSConfig{CertFile: pki.clientCert, KeyFile: pki.clientKey, CAFile: pki.ca}.Client()
		check.NoError(t, err)
		c, err := Dial(dctx, addr, DialOptions{Token: "tok", TLS: cliTLS, Logger: logs.logger()})
		check.NoError(t, err)
		defer c.Close()
		var sum int
		check.NoError(t, c.Call(dctx, "add", addArgs{A: 1, B: 2}, &sum))
		check.Equal(t, sum, 3)
	})
	t.Run("no client certificate", func(t *testing.T) {
		cliTLS, err := TLSConfig{CAFile: pki.ca}.Client()
		check.NoError(t, err)
		c, err := Dial(dctx, addr, DialOptions{Token: "tok", TLS: cliTLS, Logger: logs.logger()})
		if err == nil {
			// TLS 1.3 reports a refused client certificate on first use.
			err = c.Call(dctx, "empty", nil, nil)
			c.Close()
		}
		check.True(t, err != nil, "refused")
	})
	t.Run("unknown server", func(t *testing.T) {
		cliTLS, err := TLSConfig{CertFile: pki.clientCert, KeyFile: pki.clientKey}.Client()
		check.NoError(t, err)
		_, err = Dial(dctx, addr, DialOptions{Token: "tok", TLS: cliTLS, Logger: logs.logger()})
		check.Error(t, err, "tls handshake", "certificate")
	})
	t.Run("wrong token over TLS", func(t *testing.T) {
		cliTLS, err := TLSConfig{CertFile: pki.clientCert, KeyFile: pki.clientKey, CAFile: pki.ca}.Client()
		check.NoError(t, err)
		_, err = Dial(dctx, addr, DialOptions{Token: "nope", TLS: cliTLS, Logger: logs.logger()})
		check.ErrorIs(t, err, ErrUnauthorized)
	})
}

func TestTLSConfigErrors(t *testing.T) {
	_, err := TLSConfig{}.Server()
	check.Error(t, err, "a certificate and a key are required")
	_, err = TLSConfig{CertFile: "/nonexistent.crt", KeyFile: "/nonexistent.key"}.Server()
	check.Error(t, err, "load key pair")
	bad := filepath.Join(t.TempDir(), "bad.pem")
	check.NoError(t, os.WriteFile(bad, []byte("not pem"), 0o600))
	_, err = TLSConfig{CAFile: bad}.Client()
	check.Error(t, err, "no PEM certificates")
	cfg, err := TLSConfig{Insecure: true, ServerName: "dev0"}.Client()
	check.NoError(t, err)
	check.True(t, cfg.InsecureSkipVerify)
	check.Equal(t, cfg.ServerName, "dev0")
}
