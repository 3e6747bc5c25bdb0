package ui_test

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
	"net/http"
	"net/http/cookiejar"
	"strings"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/tracker/ui"
)

// selfSigned makes a certificate for 127.0.0.1 and a pool that trusts it.
func selfSigned(t *testing.T) (*tls.Config, *x509.CertPool) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	check.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "kiln console test"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IsCA: true, BasicConstraintsValid: true, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	check.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	check.NoError(t, err)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}, MinVersion: tls.VersionTLS12}, pool
}

// With the tracker's TLS config the console serves HTTPS only, and its
// session cookie is Secure and __Host- prefixed.
func TestConsoleOverTLS(t *testing.T) {
	f := startFleet(t, time.Second)
	srvTLS, pool := selfSigned(t)
	con, err := ui.New(ui.Config{Tracker: f.tr, TLS: srvTLS, Logger: quiet})
	check.NoError(t, err)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	check.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- con.Serve(ctx, ln) }()
	defer func() {
		cancel()
		check.NoError(t, <-served)
	}()
	base := "https://" + ln.Addr().String()

	jar, err := cookiejar.New(nil)
	check.NoError(t, err)
	c := &http.Client{Jar: jar, Timeout: time.Minute,
		Transport:     &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp := login(t, c, base, f.alice)
	check.Equal(t, resp.StatusCode, http.StatusSeeOther)
	var names []string
	for _, ck := range resp.Cookies() {
		names = append(names, ck.Name)
		check.True(t, ck.Secure && ck.HttpOnly && ck.SameSite == http.SameSiteStrictMode, ck)
	}
	check.Equal(t, strings.Join(names, ","), "__Host-kiln_console")
	code, body, h := get(t, c, base+"/fleet")
	check.Equal(t, code, http.StatusOK)
	check.True(t, strings.Contains(body, "board-7"), body)
	check.True(t, h.Get("Strict-Transport-Security") != "", h)

	// Plain HTTP gets no page.
	resp2, err := http.Get("http://" + ln.Addr().String() + "/login")
	if err == nil {
		resp2.Body.Close()
		check.Equal(t, resp2.StatusCode, http.StatusBadRequest)
	}
}
