package proto

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
)

// TLSConfig names the files of a TLS setup. The caller applies TLS: a
// listener wraps its net.Listener with tls.NewListener(ln, cfg.Server()),
// and Dial takes cfg.Client() in DialOptions.TLS.
type TLSConfig struct {
	// CertFile and KeyFile are this side's PEM certificate and key: required
	// on a server, and on a client for mutual TLS.
	CertFile, KeyFile string
	// CAFile is a PEM bundle. On a server it holds the CAs that sign client
	// certificates and turns on mutual TLS (a client without a valid
	// certificate is refused). On a client it holds the CAs that sign the
	// server's certificate (the system pool when empty).
	CAFile string
	// ServerName is the name a client checks in the server's certificate
	// (the host part of the address when empty).
	ServerName string
	// Insecure makes a client skip verifying the server's certificate.
	Insecure bool
}

// Server returns the *tls.Config of a listener.
func (c TLSConfig) Server() (*tls.Config, error) {
	if c.CertFile == "" || c.KeyFile == "" {
		return nil, fmt.Errorf("tls server config: a certificate and a key are required")
	}
	cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("tls server config: load key pair: %w", err)
	}
	cfg := &tls.Config{
		Certificates: []tls.Certificate{cert},
		MinVersion:   tls.VersionTLS12,
	}
	if c.CAFile != "" {
		pool, err := loadPool(c.CAFile)
		if err != nil {
			return nil, fmt.Errorf("tls server config: %w", err)
		}
		cfg.ClientCAs = pool
		cfg.ClientAuth = tls.RequireAndVerifyClientCert
	}
	return cfg, nil
}

// Client returns the *tls.Config of a dialer.
func (c TLSConfig) Client() (*tls.Config, error) {
	cfg := &tls.Config{
		ServerName:         c.ServerName,
		InsecureSkipVerify: c.Insecure,
		MinVersion:         tls.VersionTLS12,
	}
	if c.CertFile != "" || c.KeyFile != "" {
		cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("tls client config: load key pair: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	if c.CAFile != "" {
		pool, err := loadPool(c.CAFile)
		if err != nil {
			return nil, fmt.Errorf("tls client config: %w", err)
		}
		cfg.RootCAs = pool
	}
	return cfg, nil
}

// loadPool reads a PEM bundle into a certificate pool.
func loadPool(file string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("read CA file: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("read CA file %q: no PEM certificates in it", file)
	}
	return pool, nil
}
