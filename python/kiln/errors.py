"""kiln's exceptions. Each carries the Go side's message as it is."""

from __future__ import annotations


class KilnError(RuntimeError):
    """Base class of every error kiln raises (a RuntimeError, as TVM's
    TVMError is)."""


class KilnValueError(KilnError, ValueError):
    """A bad argument: a wrong shape or dtype for a function, a freed array
    used again, a non-contiguous array where one cannot be copied."""


class TrackerError(KilnError):
    """The tracker refused or could not be reached (wrong token, unknown
    key, dead tracker, no device within the wait)."""


class SessionError(KilnError):
    """A device session failed: could not connect, closed, ended, or a call
    on it failed."""


class BuildError(KilnError):
    """Compiling a module failed (parse error, compiler error, the build
    job failed on the compiler node)."""


class KilnCancelled(KilnError):
    """A blocking call was cancelled before it finished."""


# TVM's name for RPC errors, so ported code that catches it keeps working.
RPCError = SessionError


class RPCSessionTimeoutError(SessionError):
    """The session passed its session_timeout: the daemon ended it and freed
    the device (TVM's tvm.error.RPCSessionTimeoutError)."""


# TVM's base error name (tvm.error.TVMError).
TVMError = KilnError
