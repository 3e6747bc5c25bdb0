package cli

import (
	"crypto/tls"
	"fmt"
	"os"
	"strings"

	ucli "github.com/urfave/cli/v2"

	"github.com/kiln-ml/kiln/client"
	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// trackerFlag is --tracker: the address of a tracker, or of the replicas
// of one (HOST:PORT,HOST:PORT, or a name that resolves to each), which the
// command fails over between. A list that does not parse is refused when
// the flag is read.
func trackerFlag(usage string, required bool) *ucli.StringFlag {
	return &ucli.StringFlag{
		Name: "tracker", Required: required,
		Usage: usage + "; replicas as HOST:PORT,HOST:PORT or a name that resolves to each, failed over between",
		Action: func(_ *ucli.Context, v string) error {
			if _, err := client.ParseTrackerAddrs(v); err != nil {
				return fmt.Errorf("--tracker: %w", err)
			}
			return nil
		},
	}
}

// connFlags are the flags of every command that talks to a tracker or a
// device daemon: the token and TLS as a client.
func connFlags() []ucli.Flag {
	return []ucli.Flag{
		&ucli.StringFlag{Name: "token-file", Usage: "file holding the auth token (surrounding whitespace ignored)", EnvVars: []string{"KILN_TOKEN_FILE"}},
		&ucli.StringFlag{Name: "tls-ca", Usage: "PEM bundle of the CAs that sign the server's certificate (turns TLS on)"},
		&ucli.StringFlag{Name: "tls-cert", Usage: "client certificate (PEM) for mutual TLS"},
		&ucli.StringFlag{Name: "tls-key", Usage: "client key (PEM) for mutual TLS"},
		&ucli.StringFlag{Name: "tls-server-name", Usage: "name to check in the server's certificate (default: the address's host)"},
		&ucli.BoolFlag{Name: "tls-insecure", Usage: "TLS without verifying the server's certificate (testing only)"},
	}
}

// listenFlags are the flags of every daemon: its token and TLS as a server.
func listenFlags() []ucli.Flag {
	return []ucli.Flag{
		&ucli.StringFlag{Name: "token-file", Usage: "file holding the token every peer must present (none: no authentication)", EnvVars: []string{"KILN_TOKEN_FILE"}},
		&ucli.StringFlag{Name: "tls-cert", Usage: "server certificate (PEM); with --tls-key turns TLS on"},
		&ucli.StringFlag{Name: "tls-key", Usage: "server key (PEM)"},
		&ucli.StringFlag{Name: "tls-client-ca", Usage: "PEM bundle of CAs for client certificates (turns on mutual TLS)"},
	}
}

// readToken reads --token-file ("" when the flag is not set).
func readToken(c *ucli.Context) (string, error) {
	p := c.String("token-file")
	if p == "" {
		return "", nil
	}
	b, err := os.ReadFile(p)
	if err != nil {
		return "", fmt.Errorf("--token-file: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fmt.Errorf("--token-file %s: the file is empty", p)
	}
	return tok, nil
}

// clientTLS builds the client TLS config from connFlags (nil: plain TCP).
func clientTLS(c *ucli.Context) (*tls.Config, error) {
	if c.String("tls-ca") == "" && c.String("tls-cert") == "" && !c.Bool("tls-insecure") {
		return nil, nil
	}
	cfg, err := proto.TLSConfig{
		CertFile: c.String("tls-cert"), KeyFile: c.String("tls-key"), CAFile: c.String("tls-ca"),
		ServerName: c.String("tls-server-name"), Insecure: c.Bool("tls-insecure"),
	}.Client()
	if err != nil {
		return nil, fmt.Errorf("tls: %w", err)
	}
	return cfg, nil
}

// serverTLS builds a daemon's TLS config from listenFlags (nil: plain TCP).
func serverTLS(c *ucli.Context) (*tls.Config, error) {
	if c.String("tls-cert") == "" && c.String("tls-key") == "" {
		if c.String("tls-client-ca") != "" {
			return nil, fmt.Errorf("--tls-client-ca needs --tls-cert and --tls-key")
		}
		return nil, nil
	}
	cfg, err := proto.TLSConfig{CertFile: c.String("tls-cert"), KeyFile: c.String("tls-key"), CAFile: c.String("tls-client-ca")}.Server()
	if err != nil {
		return nil, fmt.Errorf("tls: %w", err)
	}
	return cfg, nil
}

// serverAuth reads a daemon's token and TLS flags.
func serverAuth(c *ucli.Context) (string, *tls.Config, error) {
	tok, err := readToken(c)
	if err != nil {
		return "", nil, err
	}
	cfg, err := serverTLS(c)
	return tok, cfg, err
}

// clientAuth reads a client's token and TLS flags.
func clientAuth(c *ucli.Context) (string, *tls.Config, error) {
	tok, err := readToken(c)
	if err != nil {
		return "", nil, err
	}
	cfg, err := clientTLS(c)
	return tok, cfg, err
}

// insecureFlag lets a daemon listen beyond loopback with neither a token
// nor mutual TLS, which it refuses otherwise.
func insecureFlag() ucli.Flag {
	return &ucli.BoolFlag{Name: "insecure", Usage: "listen beyond loopback with neither a token nor mutual TLS (anyone who can reach the port may use it; a warning is logged)"}
}
