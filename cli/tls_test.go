package cli

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kiln-ml/kiln/internal/check"
	"github.com/kiln-ml/kiln/ndarray"
)

// testPKI is a CA and certificates it signed, written as PEM files.
type testPKI struct {
	dir    string
	ca     *x509.Certificate
	caKey  *ecdsa.PrivateKey
	CAFile string
}

func newTestPKI(t *testing.T, dir string) *testPKI {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	check.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "kiln test CA"},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	check.NoError(t, err)
	ca, err := x509.ParseCertificate(der)
	check.NoError(t, err)
	p := &testPKI{dir: dir, ca: ca, caKey: key, CAFile: filepath.Join(dir, "ca.pem")}
	writePEM(t, p.CAFile, "CERTIFICATE", der)
	return p
}

// issue writes a certificate for 127.0.0.1 usable as a server and as a
// client certificate, and returns its and its key's paths.
func (p *testPKI) issue(t *testing.T, name string, serial int64) (certFile, keyFile string) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	check.NoError(t, err)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, p.ca, &key.PublicKey, p.caKey)
	check.NoError(t, err)
	kder, err := x509.MarshalECPrivateKey(key)
	check.NoError(t, err)
	certFile, keyFile = filepath.Join(p.dir, name+".pem"), filepath.Join(p.dir, name+"-key.pem")
	writePEM(t, certFile, "CERTIFICATE", der)
	writePEM(t, keyFile, "EC PRIVATE KEY", kder)
	return certFile, keyFile
}

func writePEM(t *testing.T, path, typ string, der []byte) {
	t.Helper()
	check.NoError(t, os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600))
}

// TestMutualTLSFleet runs a whole fleet of real processes (a tracker, a
// compiler node and two device daemons) and a client, every connection
// under mutual TLS with a token: the daemons register over TLS, the build
// goes through the tracker's queue, and the kernel runs on a leased daemon.
// A client without a certificate is refused by the tracker.
func TestMutualTLSFleet(t *testing.T) {
	f := newProcFleet(t, 500*time.Millisecond)
	pki := newTestPKI(t, f.dir)
	trCert, trKey := pki.issue(t, "tracker", 2)
	f.tracker = startProc(t, "tracker", "tracker", "--listen", "127.0.0.1:0", "--data", filepath.Join(f.dir, "tracker"),
		"--token-file", f.tokFile, "--heartbeat", f.heartbeat.String(),
		"--tls-cert", trCert, "--tls-key", trKey, "--tls-client-ca", pki.CAFile)
	f.trackerAddr = f.tracker.addr(t)

	for i, key := range []string{"cpu", "cpu"} {
		cert, key2 := pki.issue(t, "device"+string(rune('a'+i)), int64(10+i))
		p := startProc(t, "device "+key, "rpcserver", "--key", key, "--tracker", f.trackerAddr, "--listen", "127.0.0.1:0",
			"--token-file", f.tokFile, "--dir", filepath.Join(f.dir, "device"+string(rune('a'+i))),
			"--tls-cert", cert, "--tls-key", key2, "--tls-client-ca", pki.CAFile, "--tls-ca", pki.CAFile)
		p.addr(t)
		f.devices = append(f.devices, p)
	}
	ccert, ckey := pki.issue(t, "compiler", 20)
	f.compiler = startProc(t, "compiler", "compiler", "--tracker", f.trackerAddr, "--token-file", f.tokFile,
		"--work-dir", filepath.Join(f.dir, "compiler"), "--tls-ca", pki.CAFile, "--tls-cert", ccert, "--tls-key", ckey)

	uCert, uKey := pki.issue(t, "user", 30)
	tlsArgs := []string{"--token-file", f.tokFile, "--tls-ca", pki.CAFile, "--tls-cert", uCert, "--tls-key", uKey}
	eventually(t, "two cpu devices registered over TLS", func() bool {
		out, _, err := runApp(t, append([]string{"query", "--tracker", f.trackerAddr, "--json"}, tlsArgs...)...)
		return err == nil && strings.Count(out, `"key":"cpu"`) >= 1 && strings.Contains(out, `"free":2`)
	})

	art := filepath.Join(f.dir, "vadd.kiln")
	_, errOut, err := runApp(t, append([]string{"build", "testdata/vadd.py", "--tracker", f.trackerAddr, "-o", art}, tlsArgs...)...)
	check.NoError(t, err, errOut)

	x := make([]float32, 1024)
	for i := range x {
		x[i] = float32(i)
	}
	xa, err := ndarray.FromSlice(x, ndarray.Shape{1024})
	check.NoError(t, err)
	in := filepath.Join(f.dir, "x.npy")
	check.NoError(t, ndarray.SaveNPY(in, xa))
	outDir := filepath.Join(f.dir, "out")
	_, errOut, err = runApp(t, append([]string{"run", art, "--tracker", f.trackerAddr, "--key", "cpu",
		"--input", "A=" + in, "--input", "B=" + in, "--output", outDir}, tlsArgs...)...)
	check.NoError(t, err, errOut)
	c, err := ndarray.LoadNPY(filepath.Join(outDir, "C.npy"))
	check.NoError(t, err)
	got, err := ndarray.ToSlice[float32](c)
	check.NoError(t, err)
	check.Equal(t, got[1023], float32(2046))

	// The tracker asks for a client certificate: a client with the right
	// CA and token but no certificate gets nowhere.
	_, _, err = runApp(t, "query", "--tracker", f.trackerAddr, "--token-file", f.tokFile, "--tls-ca", pki.CAFile)
	check.True(t, err != nil, "a client without a certificate was served by a mutual-TLS tracker")
}
