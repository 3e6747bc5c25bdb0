package proto

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
)

// ErrExposed reports a listener that would accept anyone from beyond this
// machine: bound to a non-loopback address with neither a token nor
// mutual TLS.
var ErrExposed = errors.New("listener open to the network without authentication")

// CheckExposure fails with ErrExposed when addr (a listen address such as
// "0.0.0.0:9090" or ":9090") reaches beyond loopback while the listener
// has no token and does not require client certificates: anyone who can
// reach it could then use it (on a device daemon, upload and run native
// code). A loopback address, a token or mutual TLS passes. what names the
// listener and flag names the option that accepts the risk.
func CheckExposure(what, addr, token string, cfg *tls.Config, flag string) error {
	if token != "" || (cfg != nil && cfg.ClientAuth == tls.RequireAndVerifyClientCert) || Loopback(addr) {
		return nil
	}
	return fmt.Errorf("%s on %s: %w: give a token (--token-file) or mutual TLS (--tls-client-ca), bind to 127.0.0.1, or accept the risk with %s",
		what, addr, ErrExposed, flag)
}

// Loopback reports whether a listen address binds only loopback: a host
// that is a loopback IP or "localhost". An empty host, an unspecified
// address (0.0.0.0, ::) or any other name reaches the network.
func Loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
