package rpcserver

import (
	"path/filepath"
	"strings"
)

// relErr is an error whose message names the session's files relative to
// the session directory: what the client sees of it. It unwraps to the
// original, so its code (errors.Is) is the original's.
type relErr struct {
	msg string
	err error
}

func (e *relErr) Error() string { return e.msg }
func (e *relErr) Unwrap() error { return e.err }

// relativeErr rewrites err's message so that it names no absolute path of
// the daemon's: a path inside session directory dir becomes relative to
// it ("modules/k.so"), dir itself "the session directory", and any other
// path under root (the daemon's directory of sessions, "" when unknown)
// "the session root". Messages that name neither are left as they are.
func relativeErr(err error, dir, root string) error {
	if err == nil {
		return nil
	}
	msg := err.Error()
	out := msg
	for _, r := range []struct{ from, to string }{
		{dir + string(filepath.Separator), ""},
		{dir, "the session directory"},
		{root + string(filepath.Separator), "the session root's "},
		{root, "the session root"},
	} {
		if r.from == "" || r.from == string(filepath.Separator) || len(r.from) < 2 {
			continue
		}
		out = strings.ReplaceAll(out, r.from, r.to)
	}
	if out == msg {
		return err
	}
	return &relErr{msg: out, err: err}
}
