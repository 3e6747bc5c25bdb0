package proto

import (
	"crypto/tls"
	"testing"

	"github.com/kiln-ml/kiln/internal/check"
)

func TestCheckExposure(t *testing.T) {
	mtls := &tls.Config{ClientAuth: tls.RequireAndVerifyClientCert}
	for _, tc := range []struct {
		addr, token string
		cfg         *tls.Config
		exposed     bool
	}{
		{"127.0.0.1:9090", "", nil, false},
		{"[::1]:9090", "", nil, false},
		{"localhost:9090", "", nil, false},
		{"0.0.0.0:9090", "", nil, true},
		{":9090", "", nil, true},
		{"[::]:9090", "", nil, true},
		{"10.1.2.3:9090", "", nil, true},
		{"board7:9090", "", nil, true},
		{"0.0.0.0:9090", "", &tls.Config{}, true}, // TLS without client certificates authenticates nobody
		{"0.0.0.0:9090", "tok", nil, false},
		{"0.0.0.0:9090", "", mtls, false},
	} {
		err := CheckExposure("device daemon", tc.addr, tc.token, tc.cfg, "--insecure")
		if tc.exposed {
			check.ErrorIs(t, err, ErrExposed)
			check.Error(t, err, "--insecure")
		} else {
			check.NoError(t, err, tc.addr)
		}
	}
}
