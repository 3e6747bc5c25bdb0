package proto

import (
	"context"
	"errors"
)

// Code names an error class on the wire. Codes are stable strings so that a
// peer built from a newer kiln still reads sensibly in logs.
type Code string

// The wire codes, one for each sentinel error below.
const (
	CodeUnauthorized   Code = "unauthorized"
	CodeVersion        Code = "version"
	CodeNotFound       Code = "not_found"
	CodeBadRequest     Code = "bad_request"
	CodeDeadline       Code = "deadline"
	CodeSessionExpired Code = "session_expired"
	CodeCrashed        Code = "crashed"
	CodeBusy           Code = "busy"
	CodeUnavailable    Code = "unavailable"
	CodeInternal       Code = "internal"
	CodeCancelled      Code = "cancelled"
	CodeQuota          Code = "quota"
	CodeTooLarge       Code = "too_large"
)

// Sentinel errors. A handler returns an error that wraps one of them; the
// peer's Client returns an error that wraps the same sentinel, so callers on
// both sides of the wire branch with errors.Is.
var (
	// ErrUnauthorized: the peer's token is wrong or missing.
	ErrUnauthorized = errors.New("authentication failed")
	// ErrVersion: the peers speak different protocol versions.
	ErrVersion = errors.New("protocol version mismatch")
	// ErrNotFound: an unknown method, file, module, function or session.
	ErrNotFound = errors.New("not found")
	// ErrBadRequest: malformed input (a bad frame, bad arguments, a refused name).
	ErrBadRequest = errors.New("bad request")
	// ErrDeadline: the request's deadline passed before it finished.
	ErrDeadline = errors.New("deadline exceeded")
	// ErrSessionExpired: the session this call belongs to has passed its deadline.
	ErrSessionExpired = errors.New("session expired")
	// ErrCrashed: a kernel crashed the worker process that ran it.
	ErrCrashed = errors.New("worker crashed")
	// ErrBusy: the resource is held by someone else (an exclusive session).
	ErrBusy = errors.New("busy")
	// ErrUnavailable: the peer went away or the connection dropped.
	ErrUnavailable = errors.New("unavailable")
	// ErrInternal: anything a handler returned that is none of the above.
	ErrInternal = errors.New("internal error")
	// ErrCancelled: the caller cancelled the request.
	ErrCancelled = errors.New("cancelled")
	// ErrQuota: a per-session or per-daemon limit (disk, memory, sessions) is spent.
	ErrQuota = errors.New("quota exceeded")
	// ErrTooLarge: a frame, upload or result exceeds a size limit.
	ErrTooLarge = errors.New("too large")
)

// codes lists every code with its sentinel, in the order errorCode tries them.
var codes = []struct {
	code Code
	err  error
}{
	{CodeUnauthorized, ErrUnauthorized},
	{CodeVersion, ErrVersion},
	{CodeNotFound, ErrNotFound},
	{CodeBadRequest, ErrBadRequest},
	{CodeDeadline, ErrDeadline},
	{CodeSessionExpired, ErrSessionExpired},
	{CodeCrashed, ErrCrashed},
	{CodeBusy, ErrBusy},
	{CodeUnavailable, ErrUnavailable},
	{CodeInternal, ErrInternal},
	{CodeCancelled, ErrCancelled},
	{CodeQuota, ErrQuota},
	{CodeTooLarge, ErrTooLarge},
}

// Sentinel returns the sentinel error of code; an unknown code (from a newer
// peer) maps to ErrInternal.
func (c Code) Sentinel() error {
	for _, e := range codes {
		if e.code == c {
			return e.err
		}
	}
	return ErrInternal
}

// WireError is an error as it crosses the wire: a code and the full message.
// It is also the error a Client returns for a failed call: it unwraps to the
// sentinel of its code, so errors.Is(err, ErrNotFound) works on the caller's
// side exactly as on the handler's side.
type WireError struct {
	Code    Code   `msgpack:"code"`
	Message string `msgpack:"message"`
}

// Error returns the message the peer sent, or the sentinel's text when the
// peer sent none.
func (e *WireError) Error() string {
	if e.Message == "" {
		return e.Code.Sentinel().Error()
	}
	return e.Message
}

// Unwrap returns the sentinel of e's code.
func (e *WireError) Unwrap() error { return e.Code.Sentinel() }

// ToWire turns err into a WireError: a WireError in err's chain is kept as it
// is; otherwise the code is the first sentinel err wraps (context errors
// count as ErrDeadline and ErrCancelled), ErrInternal when none, and the
// message is err's text. ToWire(nil) is nil.
func ToWire(err error) *WireError {
	if err == nil {
		return nil
	}
	var we *WireError
	if errors.As(err, &we) {
		if we.Error() == err.Error() {
			return we
		}
		return &WireError{Code: we.Code, Message: err.Error()}
	}
	return &WireError{Code: errorCode(err), Message: err.Error()}
}

// errorCode finds the code of err by errors.Is against the sentinels.
func errorCode(err error) Code {
	for _, e := range codes {
		if errors.Is(err, e.err) {
			return e.code
		}
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return CodeDeadline
	case errors.Is(err, context.Canceled):
		return CodeCancelled
	}
	return CodeInternal
}

// newError builds a WireError with code and message, for errors this package
// raises itself and wants to carry a precise text.
func newError(code Code, message string) *WireError {
	return &WireError{Code: code, Message: message}
}
