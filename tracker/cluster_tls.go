package tracker

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"time"

	"go.etcd.io/etcd/client/pkg/v3/transport"
)

// An embedded member speaks mutual TLS on both of its URLs, always.
//
// Its client URL (this tracker's own connection to etcd) uses a CA of
// the member's own, made at its first start and kept in its directory
// (tls/, readable by the tracker's user only), with a server certificate
// for the URL's address and one client certificate, the tracker's, issued
// afresh at every start: nothing but the tracker (and an operator's
// etcdctl given tls/client.crt) holds a certificate that CA signed, so no
// other process is served on the member's client port, whatever it binds.
//
// Its peer URLs use, in this order: the tracker's own certificate, key
// and client CA (--tls-cert, --tls-key, --tls-client-ca) when all three
// are given; otherwise a cluster CA derived from the fleet token
// (--token-file), which every member of one fleet holds, each member
// issuing itself a peer certificate from it at start; a one-member
// cluster without either uses a CA of its own, as its client URL does.
// Several members with neither are refused: their peers would have
// nothing to authenticate each other with.

// memberTLS is an embedded member's TLS material.
type memberTLS struct {
	client    transport.TLSInfo // the client listener's
	peer      transport.TLSInfo // the peer listener's and peer client's
	clientCfg *tls.Config       // the tracker's client toward the member
	peerAuth  string            // how the peers authenticate, for the log
}

// tlsDir is where a member's TLS files go, under its data directory.
const tlsDir = "tls"

// clusterCAInfo is the HKDF info that derives the cluster CA's key from
// the fleet token: a key used for nothing else.
const clusterCAInfo = "kiln embedded etcd cluster CA v1"

// prepareTLS makes the member's TLS material in dir/tls. peerHost is
// the host of this member's peer URL, clientHost of its client URL;
// members is how many the cluster has; token is the fleet token.
func (c *ClusterConfig) prepareTLS(dir, peerHost, clientHost string, members int, token string) (*memberTLS, error) {
	d := filepath.Join(dir, tlsDir)
	if err := os.MkdirAll(d, 0o700); err != nil {
		return nil, fmt.Errorf("embedded etcd TLS: %w", err)
	}
	if err := os.Chmod(d, 0o700); err != nil {
		return nil, fmt.Errorf("embedded etcd TLS: %w", err)
	}
	m := &memberTLS{}

	// The client URL: the member's own CA.
	local, caFile, err := localCA(d, "client-ca", "kiln embedded etcd client CA")
	if err != nil {
		return nil, err
	}
	srvCert, srvKey, err := local.issueFiles(d, "client-server", "kiln embedded etcd", []string{clientHost, "127.0.0.1", "::1", "localhost"})
	if err != nil {
		return nil, err
	}
	m.client = transport.TLSInfo{CertFile: srvCert, KeyFile: srvKey, TrustedCAFile: caFile, ClientCertAuth: true}
	cliCert, cliKey, err := local.issueFiles(d, "client", "kiln-tracker", nil)
	if err != nil {
		return nil, err
	}
	pair, err := tls.LoadX509KeyPair(cliCert, cliKey)
	if err != nil {
		return nil, fmt.Errorf("embedded etcd TLS: %w", err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(local.cert)
	m.clientCfg = &tls.Config{Certificates: []tls.Certificate{pair}, RootCAs: pool, MinVersion: tls.VersionTLS12}

	// The peer URLs.
	switch {
	case c.CertFile != "" && c.KeyFile != "" && c.CAFile != "":
		m.peer = transport.TLSInfo{CertFile: c.CertFile, KeyFile: c.KeyFile, TrustedCAFile: c.CAFile, ClientCertAuth: true}
		m.peerAuth = "the tracker's certificate (--tls-cert, --tls-client-ca)"
		return m, nil
	case token != "":
		ca, err := derivedCA(token)
		if err != nil {
			return nil, err
		}
		m.peerAuth = "a cluster CA derived from the fleet token"
		return m, m.peerFiles(d, ca, peerHost)
	case members == 1:
		m.peerAuth = "a CA of this member's own (a cluster of one)"
		return m, m.peerFiles(d, local, peerHost)
	}
	return nil, fmt.Errorf("cluster member %s: the %d members' peer traffic is mutual TLS, and they have nothing to authenticate each other with: give every member the same --token-file (their cluster CA is derived from it), or --tls-cert, --tls-key and --tls-client-ca", c.Name, members)
}

// peerFiles issues this member's peer certificate from ca.
func (m *memberTLS) peerFiles(d string, ca *certAuthority, peerHost string) error {
	caFile := filepath.Join(d, "peer-ca.crt")
	if err := writePEMFile(caFile, "CERTIFICATE", ca.der); err != nil {
		return err
	}
	cert, key, err := ca.issueFiles(d, "peer", "kiln embedded etcd peer", []string{peerHost})
	if err != nil {
		return err
	}
	m.peer = transport.TLSInfo{CertFile: cert, KeyFile: key, TrustedCAFile: caFile, ClientCertAuth: true}
	return nil
}

// certAuthority is a CA certificate and its key.
type certAuthority struct {
	cert *x509.Certificate
	der  []byte
	key  crypto.Signer
}

// localCA loads the CA kept in d as name.crt and name.key, or makes one
// there when there is none; it returns the CA and its certificate's path.
func localCA(d, name, cn string) (*certAuthority, string, error) {
	certFile, keyFile := filepath.Join(d, name+".crt"), filepath.Join(d, name+".key")
	if ca, err := readCA(certFile, keyFile); err == nil {
		return ca, certFile, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, "", fmt.Errorf("embedded etcd TLS: %s: %w (remove %s and %s to make a new one)", name, err, filepath.Base(certFile), filepath.Base(keyFile))
	}
	ca, err := newCA(cn)
	if err != nil {
		return nil, "", err
	}
	kder, err := x509.MarshalPKCS8PrivateKey(ca.key)
	if err != nil {
		return nil, "", err
	}
	if err := writePEMFile(keyFile, "PRIVATE KEY", kder); err != nil {
		return nil, "", err
	}
	if err := writePEMFile(certFile, "CERTIFICATE", ca.der); err != nil {
		return nil, "", err
	}
	return ca, certFile, nil
}

// readCA reads a CA's certificate and key.
func readCA(certFile, keyFile string) (*certAuthority, error) {
	pair, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		if _, serr := os.Stat(certFile); errors.Is(serr, os.ErrNotExist) {
			return nil, serr
		}
		return nil, err
	}
	cert, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		return nil, err
	}
	key, ok := pair.PrivateKey.(crypto.Signer)
	if !ok || !cert.IsCA {
		return nil, errors.New("not a CA certificate and its key")
	}
	return &certAuthority{cert: cert, der: pair.Certificate[0], key: key}, nil
}

// newCA makes a CA with a random key.
func newCA(name string) (*certAuthority, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("embedded etcd TLS: CA key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, err
	}
	now := time.Now()
	return selfSign(name, serial, now.Add(-time.Hour), now.Add(20*365*24*time.Hour), key)
}

// derivedCA is the cluster CA every member holding token derives alike:
// an Ed25519 key from HKDF-SHA256 of the token, and a certificate with
// fixed fields (Ed25519 signatures are deterministic, so the certificate
// is the same on every member too).
func derivedCA(token string) (*certAuthority, error) {
	seed, err := hkdf.Key(sha256.New, []byte(token), nil, clusterCAInfo, ed25519.SeedSize)
	if err != nil {
		return nil, fmt.Errorf("embedded etcd TLS: derive the cluster CA: %w", err)
	}
	key := ed25519.NewKeyFromSeed(seed)
	from := time.Date(2020, 1, 1, 0, 0, 0, 0, time.UTC)
	return selfSign("kiln embedded etcd cluster CA", big.NewInt(1), from, from.AddDate(100, 0, 0), key)
}

func selfSign(name string, serial *big.Int, from, to time.Time, key crypto.Signer) (*certAuthority, error) {
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: name, Organization: []string{"kiln"}},
		NotBefore:             from,
		NotAfter:              to,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
		MaxPathLenZero:        true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, fmt.Errorf("embedded etcd TLS: CA certificate: %w", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &certAuthority{cert: cert, der: der, key: key}, nil
}

// issueFiles issues a certificate (server and client use) for hosts,
// with a fresh key, and writes both to d as name.crt and name.key.
func (ca *certAuthority) issueFiles(d, name, cn string, hosts []string) (certFile, keyFile string, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return "", "", fmt.Errorf("embedded etcd TLS: key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return "", "", err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: cn, Organization: []string{"kiln"}},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(10 * 365 * 24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return "", "", fmt.Errorf("embedded etcd TLS: %s certificate: %w", name, err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return "", "", err
	}
	certFile, keyFile = filepath.Join(d, name+".crt"), filepath.Join(d, name+".key")
	if err := writePEMFile(keyFile, "PRIVATE KEY", kder); err != nil {
		return "", "", err
	}
	if err := writePEMFile(certFile, "CERTIFICATE", der); err != nil {
		return "", "", err
	}
	return certFile, keyFile, nil
}

// writePEMFile writes one PEM block to path, readable by its owner only,
// replacing what was there in one rename.
func writePEMFile(path, typ string, der []byte) error {
	tmp := path + ".new"
	err := os.WriteFile(tmp, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("embedded etcd TLS: write %s: %w", filepath.Base(path), err)
	}
	return nil
}

// checkHTTPS refuses a member URL that is not https.
func checkHTTPS(what, raw string, u *url.URL) error {
	if u.Scheme != "https" {
		return errors.New(what + " " + raw + " is " + u.Scheme + ": an embedded etcd member speaks mutual TLS only; use https://")
	}
	return nil
}
