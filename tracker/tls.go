package tracker

import (
	"crypto/tls"
	"net"
)

func tlsListener(ln net.Listener, cfg *tls.Config) net.Listener { return tls.NewListener(ln, cfg) }
