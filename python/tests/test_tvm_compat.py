"""kiln.tvm_compat: TVM's import path (``import kiln.tvm_compat as tvm``)
resolves to kiln's objects, and sessions are freed as TVM's are, by
dropping the last reference."""

import gc
import os
import time

import numpy as np
import pytest

import kiln
import kiln.tvm_compat as tvm


def test_tvm_names_resolve():
    from kiln.tvm_compat.rpc import RPCSession, TrackerSession, connect, connect_tracker
    from kiln.tvm_compat.rpc.proxy import Proxy
    from kiln.tvm_compat.rpc.server import Server
    from kiln.tvm_compat.rpc.tracker import Tracker
    from kiln.tvm_compat.runtime import Device, Module, Tensor
    from kiln.tvm_compat.support.utils import tempdir
    from kiln.tvm_compat.tir import FloatImm

    assert RPCSession is kiln.rpc.RPCSession and TrackerSession is kiln.rpc.TrackerSession
    assert connect is kiln.rpc.connect and connect_tracker is kiln.rpc.connect_tracker
    assert Server is kiln.rpc.Server and Tracker is kiln.rpc.Tracker and Proxy is kiln.rpc.Proxy
    assert Device is kiln.Device and Module is kiln.Module and Tensor is kiln.NDArray
    assert FloatImm is kiln.tir.FloatImm
    assert tvm.error.RPCSessionTimeoutError is kiln.RPCSessionTimeoutError
    assert tvm.error.TVMError is kiln.KilnError and tvm.error.RPCError is kiln.RPCError
    assert tvm.cpu(0) == kiln.cpu(0) and tvm.device("cpu", 0) == kiln.cpu(0)
    assert tvm.compile is kiln.build and tvm.IRModule is kiln.IRModule
    a = tvm.runtime.tensor(np.arange(6, dtype="float32").reshape(2, 3), tvm.cpu(0))
    assert isinstance(a, tvm.runtime.Tensor)
    tvm.testing.assert_allclose(a.numpy(), np.arange(6).reshape(2, 3))
    e = tvm.runtime.empty((4,), "int32", tvm.cpu())
    assert e.shape == (4,) and str(e.dtype) == "int32"
    assert tvm.runtime.convert(1024) == 1024
    t = tempdir()
    path = t.relpath("x.bin")
    open(path, "wb").close()
    assert os.path.exists(path)
    d = t.temp_dir
    del t
    gc.collect()
    assert not os.path.exists(d)


def test_register_and_get_global_func():
    @tvm.register_func("kiln.test.compat_add")
    def add(a, b):
        return a + b

    assert tvm.get_global_func("kiln.test.compat_add")(2, 3) == 5
    with pytest.raises(kiln.KilnValueError, match="registered already"):
        tvm.register_func("kiln.test.compat_add", add)
    tvm.register_func("kiln.test.compat_add", lambda a, b: a * b, override=True)
    assert tvm.get_global_func("kiln.test.compat_add")(2, 3) == 6
    # The local session's built-ins are globals too, as in TVM's process.
    assert tvm.get_global_func("testing.echo")(7) == 7
    assert tvm.get_global_func("kiln.test.no_such", allow_missing=True) is None
    with pytest.raises(AttributeError):
        tvm.get_global_func("kiln.test.no_such")
    with pytest.raises(kiln.KilnValueError, match="non-empty string"):
        tvm.register_func("", add)


def test_dropped_session_frees_its_device(fleet, tracker, matmul_artifact):
    # TVM frees a session when its last reference goes; the lease goes
    # with it at once, even when the TrackerSession it came from is gone,
    # and with a module and its function taken from it (no cycle holds
    # it for Python's cycle collector).
    gc.disable()
    try:
        t = kiln.rpc.connect_tracker("127.0.0.1", fleet.tracker_port, token=fleet.token)
        sess = t.request("cpu", session_timeout=120, wait=60, progress=False)
        del t
        sess.upload(matmul_artifact)
        mod = sess.load_module(os.path.basename(matmul_artifact))
        f = mod["matrix_multiply"]
        a = kiln.nd.array(np.ones((4, 4), "float32"), sess.cpu(0))
        f(a, a, a)
        assert _free(tracker) == 0
        del sess, mod, f, a
        assert _free(tracker) == 1
    finally:
        gc.enable()


def _free(t):
    return t.summary()["queue_info"]["cpu"]["free"]


def test_direct_session_timeout_frees_the_device_while_held(kiln_binary, monkeypatch):
    # rpc.connect's session_timeout is kept by the daemon: past it, the
    # device is free for the next client although the first still holds
    # its session object, and that object's next call says it timed out.
    monkeypatch.setenv("KILN_BINARY", kiln_binary)
    server = kiln.rpc.Server(key="x1")
    try:
        held = kiln.rpc.connect("127.0.0.1", server.port, session_timeout=1)
        addone = held.get_function("rpc.test.addone")
        assert addone(1) == 2
        other = None
        for _ in range(600):  # bounded: the daemon's timer fires after 1 s
            try:
                other = kiln.rpc.connect("127.0.0.1", server.port)
                break
            except kiln.SessionError as e:
                assert "busy" in str(e), e
                time.sleep(0.1)
        assert other is not None, "the device stayed busy"
        assert other.get_function("rpc.test.addone")(41) == 42
        with pytest.raises(kiln.RPCSessionTimeoutError):
            addone(2)
        other.close()
        held.close()
    finally:
        server.terminate()
