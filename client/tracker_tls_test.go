package client

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net"
	"testing"
	"time"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// TestTLSTrackerByName: a tracker named by a name that resolves to its
// address is checked against that name, not the address dialled.
func TestTLSTrackerByName(t *testing.T) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	check.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "localhost"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IsCA: true, BasicConstraintsValid: true, DNSNames: []string{"localhost"}, // no IP address
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	check.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	check.NoError(t, err)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	check.NoError(t, err)
	srv := proto.NewServer(proto.ServerConfig{Logger: quiet()})
	srv.Handle(proto.MethodTrackerQuery, func(ctx context.Context, c *proto.Conn, raw msgpack.RawMessage) (any, error) {
		return proto.TrackerSummary{Leases: 7}, nil
	})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	sctx, stop := context.WithCancel(ctx)
	served := make(chan error, 1)
	go func() {
		served <- srv.Serve(sctx, tls.NewListener(ln, &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}))
	}()
	defer func() {
		stop()
		<-served
	}()
	roots := x509.NewCertPool()
	roots.AddCert(cert)
	opts := TrackerOptions{TLS: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}, Logger: quiet()}
	_, port, _ := net.SplitHostPort(ln.Addr().String())

	tr, err := DialTracker(ctx, "localhost:"+port, opts)
	check.NoError(t, err)
	defer tr.Close()
	sum, err := tr.Query(ctx, 0)
	check.NoError(t, err)
	check.Equal(t, sum.Leases, 7)

	_, err = DialTracker(ctx, "127.0.0.1:"+port, opts)
	check.Error(t, err, "certificate")
}
