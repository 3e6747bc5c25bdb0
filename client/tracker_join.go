package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/kiln-ml/kiln/rpcserver/proto"
)

// fatalError is a registration failure that retrying cannot cure (a
// missing or unreadable credential file).
type fatalError struct{ error }

func (e fatalError) Unwrap() error { return e.error }

// joinTokenPrefix starts every join token (tracker.JoinTokenPrefix).
const joinTokenPrefix = "kiln-join-"

// IsJoinToken reports whether token is a join token, to be exchanged for a
// node credential rather than presented at every hello.
func IsJoinToken(token string) bool { return strings.HasPrefix(token, joinTokenPrefix) }

// nodeCredential is the content of a Registrar's CredentialFile.
type nodeCredential struct {
	Tracker    string `json:"tracker"`
	NodeID     string `json:"node_id"`
	Role       string `json:"role"`
	Credential string `json:"credential"`
}

// usesCredential reports whether the registrar presents a node credential.
func (r *Registrar) usesCredential() bool {
	if r.opts.CredentialFile == "" {
		return false
	}
	_, err := os.Stat(r.opts.CredentialFile)
	return err == nil
}

// token returns what the next hello carries: the node credential from
// CredentialFile when there is one (fixing the node id to the one it is
// bound to), the credential a join token is exchanged for when there is
// not, or Token itself.
func (r *Registrar) token(ctx context.Context) (string, error) {
	if f := r.opts.CredentialFile; f != "" {
		cred, err := readCredential(f)
		if err == nil {
			if cred.Role != r.role.String() {
				return "", fatalError{fmt.Errorf("credential file %s holds a %s credential; this node is a %s", f, cred.Role, r.role)}
			}
			r.mu.Lock()
			defer r.mu.Unlock()
			if r.args.NodeID != "" && r.args.NodeID != cred.NodeID {
				return "", fatalError{fmt.Errorf("credential file %s is for node %q, not %q", f, cred.NodeID, r.args.NodeID)}
			}
			r.args.NodeID = cred.NodeID
			return cred.Credential, nil
		}
		if !errors.Is(err, os.ErrNotExist) {
			return "", fatalError{err}
		}
	}
	if !IsJoinToken(r.opts.Token) {
		return r.opts.Token, nil
	}
	if r.opts.CredentialFile == "" {
		return "", fatalError{errors.New("a join token is exchanged for a node credential, which needs a file to be kept in (--credential-file)")}
	}
	return r.join(ctx)
}

// join exchanges the join token for a node credential and stores it in
// CredentialFile before using it.
func (r *Registrar) join(ctx context.Context) (string, error) {
	c, addr, err := r.opts.dialAny(ctx, r.addrs, r.role)
	if err != nil {
		return "", fmt.Errorf("join with a join token: %w", err)
	}
	defer c.Close()
	// The tracker assigns the id; the credential proves it from then on.
	var rep proto.JoinReply
	if err := c.Call(ctx, proto.MethodTrackerJoin, proto.JoinArgs{}, &rep); err != nil {
		return "", fmt.Errorf("join: %w", err)
	}
	if rep.Role != r.role || rep.NodeID == "" || rep.Credential == "" {
		return "", fatalError{fmt.Errorf("join: the tracker answered role %s, node %q: want a %s credential", rep.Role, rep.NodeID, r.role)}
	}
	cred := nodeCredential{Tracker: addr, NodeID: rep.NodeID, Role: rep.Role.String(), Credential: rep.Credential}
	if err := writeCredential(r.opts.CredentialFile, cred); err != nil {
		return "", fatalError{err}
	}
	r.log.Info("joined the tracker; node credential stored", "node", rep.NodeID, "file", r.opts.CredentialFile)
	r.mu.Lock()
	r.args.NodeID = rep.NodeID
	r.mu.Unlock()
	return rep.Credential, nil
}

func readCredential(path string) (nodeCredential, error) {
	var cred nodeCredential
	b, err := os.ReadFile(path)
	if err != nil {
		return cred, fmt.Errorf("credential file: %w", err)
	}
	if err := json.Unmarshal(b, &cred); err != nil {
		return cred, fmt.Errorf("credential file %s: %v", path, err)
	}
	if cred.NodeID == "" || !strings.HasPrefix(cred.Credential, "kiln-node-") {
		return cred, fmt.Errorf("credential file %s: no node id or no credential in it", path)
	}
	return cred, nil
}

// writeCredential writes cred to path (0600) so that a crash leaves either
// the old file or the whole new one.
func writeCredential(path string, cred nodeCredential) error {
	b, err := json.MarshalIndent(cred, "", "  ")
	if err != nil {
		return err
	}
	return writeFileAtomic(path, append(b, '\n'), "credential file")
}

// writeFileAtomic writes data to path (0600) so that a crash leaves either
// the old file or the whole new one; errors start with what.
func writeFileAtomic(path string, data []byte, what string) error {
	dir := filepath.Dir(path)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+"-*")
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	tmp := f.Name()
	defer os.Remove(tmp)
	_, err = f.Write(data)
	if err == nil {
		err = f.Chmod(0o600)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", what, err)
	}
	if d, err := os.Open(dir); err == nil {
		d.Sync()
		d.Close()
	}
	return nil
}
