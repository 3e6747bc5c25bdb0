"""Apache TVM's RPC unit tests (tests/python/runtime/test_runtime_rpc.py),
ported with only the imports and the module-building step changed: every
assertion is TVM's. tvm.rpc is kiln.rpc, tvm.runtime.tensor is
kiln.nd.array, tvm.compile is kiln.build, rpc.Server and Tracker start the
kiln binary's daemons on loopback. TVM's minrpc, PowerPC and OpenCL checks
have no counterpart (kiln has no minrpc server; no board is present):
those tests are skipped with the reason. The proxy tests run against
`kiln proxy`, whose fleet has a token (KILN_TOKEN_FILE)."""

import gc
import multiprocessing
import os
import shutil
import sys
import tempfile
import time

import numpy as np
import pytest

import kiln as tvm
from kiln import rpc, te
from kiln.rpc import Proxy, Tracker

kiln = tvm


class utils:
    """tvm.support.utils.tempdir's counterpart."""

    class tempdir:
        def __init__(self):
            self.temp_dir = tempfile.mkdtemp(prefix="kiln-rpc-test-")

        def relpath(self, name):
            return os.path.join(self.temp_dir, name)

        def __del__(self):
            shutil.rmtree(self.temp_dir, ignore_errors=True)


@pytest.fixture(autouse=True)
def _kiln_binary(kiln_binary, monkeypatch):
    monkeypatch.setenv("KILN_BINARY", kiln_binary)
    yield
    # A TVM test whose assertion fails leaves its forked clients spinning.
    for p in multiprocessing.active_children():
        p.terminate()
        p.join(30)


def test_bigendian_rpc():
    """Test big endian rpc when there is a PowerPC RPC server available"""
    host = os.environ.get("TVM_POWERPC_TEST_HOST", None)
    port = os.environ.get("TVM_POWERPC_TEST_PORT", 9090)
    if host is None:
        pytest.skip("no PowerPC RPC server (TVM_POWERPC_TEST_HOST)")

    def verify_rpc(remote, target, shape, dtype):
        A = te.placeholder(shape, dtype=dtype)
        B = te.compute(A.shape, lambda i: A[i] + 1)
        f = tvm.build(te.create_prim_func([A, B]), target=target)

        dev = remote.cpu(0)
        a = tvm.nd.array(np.random.randint(0, 256, size=shape).astype(A.dtype), device=dev)
        b = tvm.nd.array(np.zeros(shape).astype(A.dtype), device=dev)
        temp = utils.tempdir()
        path_dso = temp.relpath("dev_lib.o")
        f.export_library(path_dso)
        remote.upload(path_dso)
        f = remote.load_module("dev_lib.o")
        f(a, b)
        np.testing.assert_allclose(a.numpy() + 1, b.numpy())

    remote = rpc.connect(host, port)
    target = "cpu -mtriple=powerpc-linux-gnu"
    for dtype in ["float32", "float64", "int32", "int8"]:
        verify_rpc(remote, target, (10,), dtype)


def test_rpc_simple():
    server = rpc.Server(key="x1")
    client = rpc.connect("127.0.0.1", server.port, key="x1")

    def check_remote():
        f1 = client.get_function("rpc.test.addone")
        assert f1(10) == 11
        f3 = client.get_function("rpc.test.except")

        with pytest.raises(RuntimeError):
            f3("abc")

        f2 = client.get_function("rpc.test.strcat")
        assert f2("abc", 11) == "abc:11"

    check_remote()


def test_rpc_runtime_string():
    server = rpc.Server(key="x1")
    client = rpc.connect("127.0.0.1", server.port, key="x1")

    def check_remote():
        func = client.get_function("rpc.test.runtime_str_concat")
        x = "abc"
        y = "def"
        assert str(func(x, y)) == "abcdef"

    check_remote()


def test_rpc_array():
    server = rpc.Server()
    remote = rpc.connect("127.0.0.1", server.port)

    def check_remote():
        x = np.ones((3, 4))
        r_cpu = tvm.nd.array(x, remote.cpu(0))
        assert str(r_cpu.device).startswith("remote")
        np.testing.assert_equal(r_cpu.numpy(), x)
        fremote = remote.get_function("rpc.test.remote_tensor_func")
        fremote(r_cpu)

    check_remote()


def test_rpc_large_array():
    # testcase of large array creation
    server = rpc.Server()
    remote = rpc.connect("127.0.0.1", server.port)

    def check_remote():
        dev = remote.cpu(0)
        a_np = np.ones((5041, 720)).astype("float32")
        b_np = np.ones((720, 192)).astype("float32")
        a = tvm.nd.array(a_np, dev)
        b = tvm.nd.array(b_np, dev)
        np.testing.assert_equal(a.numpy(), a_np)
        np.testing.assert_equal(b.numpy(), b_np)

    check_remote()


def test_rpc_echo():
    def check(remote, local_session):
        fecho = remote.get_function("testing.echo")
        assert fecho(1, 2, 3) == 1
        assert fecho(100, 2, 3) == 100
        assert fecho("xyz") == "xyz"
        assert bytes(fecho(bytearray(b"123"))) == b"123"

        with pytest.raises(RuntimeError):
            raise_err = remote.get_function("testing.test_raise_error")
            raise_err("RuntimeError", "msg")

        remote.cpu().sync()
        # tests around system lib are not threadsafe by design
        # and do not work well with multithread pytest
        # skip local session as they are being tested elsewhere
        if not local_session:
            with pytest.raises(AttributeError):
                f3 = remote.system_lib()["notexist"]

    server = rpc.Server()
    client = rpc.connect("127.0.0.1", server.port)
    check(rpc.LocalSession(), True)

    check(client, False)


def test_rpc_file_exchange():
    server = rpc.Server()
    remote = rpc.connect("127.0.0.1", server.port)

    def check_remote():
        blob = bytearray(np.random.randint(0, 10, size=(10)))
        remote.upload(blob, "dat.bin")
        rev = remote.download("dat.bin")
        assert rev == blob

    check_remote()


def test_rpc_remote_module():
    # graph
    n = 102
    A = te.placeholder((n,), name="A")
    B = te.compute(A.shape, lambda *i: A[i] + 1.0, name="B")
    mod = te.create_prim_func([A, B])

    server0 = rpc.Server(key="x0")
    server1 = rpc.Server(key="x1")

    client = rpc.connect(
        "127.0.0.1",
        server0.port,
        key="x0",
        session_constructor_args=["rpc.Connect", "127.0.0.1", server1.port, "x1", False],
    )

    def check_remote(remote):
        temp = utils.tempdir()
        dev = remote.cpu(0)
        f = tvm.build(mod, target="llvm", name="myadd")
        path_dso = temp.relpath("dev_lib.so")
        f.export_library(path_dso)
        remote.upload(path_dso)
        f1 = remote.load_module("dev_lib.so")
        a = tvm.nd.array(np.random.uniform(size=102).astype(A.dtype), dev)
        b = tvm.nd.array(np.zeros(102, dtype=A.dtype), dev)
        time_f = f1.time_evaluator(f1.entry_name, remote.cpu(0), number=10)
        cost = time_f(a, b).mean
        print(f"{cost:g} secs/op")
        np.testing.assert_equal(b.numpy(), a.numpy() + 1)

        # Download the file from the remote
        path_tar = temp.relpath("dev_lib.tar")
        f.export_library(path_tar)
        remote.upload(path_tar)
        local_download_path = temp.relpath("dev_lib.download.so")
        with open(local_download_path, "wb") as fo:
            fo.write(remote.download_linked_module("dev_lib.tar"))
        fupdated = tvm.runtime.load_module(local_download_path)
        a = tvm.nd.array(np.random.uniform(size=102).astype(A.dtype), tvm.cpu(0))
        b = tvm.nd.array(np.zeros(102, dtype=A.dtype), tvm.cpu(0))
        fupdated(a, b)
        np.testing.assert_equal(b.numpy(), a.numpy() + 1)

    check_remote(rpc.LocalSession())
    check_remote(client)


def test_rpc_return_func():
    server = rpc.Server(key="x1")
    client = rpc.connect("127.0.0.1", server.port, key="x1")

    def check_remote():
        f1 = client.get_function("rpc.test.add_to_lhs")
        fadd = f1(10)
        assert fadd(12) == 22

    check_remote()


def test_rpc_session_constructor_args():
    # start server
    server0 = rpc.Server(key="x0")
    server1 = rpc.Server(key="x1")

    def check_multi_hop():
        # use server0 as proxy to connect to server1
        client = rpc.connect(
            "127.0.0.1",
            server0.port,
            key="x0",
            session_constructor_args=["rpc.Connect", "127.0.0.1", server1.port, "x1", False],
        )

        fecho = client.get_function("testing.echo")
        assert fecho(1, 2, 3) == 1
        assert fecho(100, 2, 3) == 100
        assert fecho("xyz") == "xyz"
        assert bytes(fecho(bytearray(b"123"))) == b"123"

        nd = tvm.nd.array([1, 2, 3], device=client.cpu(0))
        assert nd.numpy()[1] == 2

    def check_error_handling():
        with pytest.raises(tvm.error.RPCError):
            client = rpc.connect(
                "127.0.0.1",
                server0.port,
                key="x0",
                session_constructor_args=["rpc.NonExistingConstructor"],
            )

    check_multi_hop()
    check_error_handling()


def test_rpc_return_tensor():
    def run_arr_test():
        server = rpc.Server(key="x1")
        client = rpc.connect("127.0.0.1", server.port, key="x1")
        m = client.get_function("rpc.test.remote_return_nd")
        get_arr = m("get_arr")
        get_elem = m("get_elem")
        get_arr_elem = m("get_arr_elem")

        arr = get_arr()
        assert get_elem(0) == 0.0
        assert get_arr_elem(arr, 0) == 0.0

        del arr
        gc.collect()
        assert get_elem(0) == 0.0

    run_arr_test()


def test_rpc_return_remote_object():
    def check(client, is_local):
        make_shape = client.get_function("ffi.Shape")
        get_elem = client.get_function("rpc.testing.GetShapeElem")
        get_size = client.get_function("rpc.testing.GetShapeSize")
        shape = make_shape(2, 3)
        assert get_elem(shape, 0) == 2
        assert get_elem(shape, 1) == 3
        assert get_size(shape) == 2
        # Test free object by assigning to the same variable
        shape = make_shape(0)
        assert get_size(shape) == 1
        assert get_elem(shape, 0) == 0

    # start server

    check(rpc.LocalSession(), True)

    def check_remote():
        server = rpc.Server(key="x1")
        client = rpc.connect("127.0.0.1", server.port, key="x1")
        check(client, False)

    check_remote()


def test_local_func():
    client = rpc.LocalSession()

    def check_remote():
        f1 = client.get_function("rpc.test.add_to_lhs")
        fadd = f1(10)
        assert fadd(12) == 22

        blob = bytearray(np.random.randint(0, 10, size=(10)))
        client.upload(blob, "dat.bin")
        rev = client.download("dat.bin")
        assert rev == blob

    check_remote()


@pytest.mark.parametrize("device_key", ["test_device", "127.0.0.1:5555"])
def test_rpc_tracker_register(device_key):
    # test registration
    tracker = Tracker(port=9000, port_end=10000)
    server1 = rpc.Server(
        host="127.0.0.1",
        port=9000,
        port_end=10000,
        key=device_key,
        tracker_addr=("127.0.0.1", tracker.port),
    )
    server2 = rpc.Server(
        host="127.0.0.1",
        port=9000,
        port_end=10000,
        key=device_key,
        tracker_addr=("127.0.0.1", tracker.port),
        custom_addr="test_addr",  # this is a test address, which is unable to connect
    )
    time.sleep(1)
    client = rpc.connect_tracker("127.0.0.1", tracker.port)

    def exist_address(summary, key, host, port):
        server_info = summary["server_info"]
        for device in server_info:
            if device["key"] == f"server:{key}":
                addr = device["addr"]
                if (host is None or host == addr[0]) and port == addr[1]:
                    return True
        return False

    summary = client.summary()
    assert summary["queue_info"][device_key]["free"] == 2
    assert exist_address(summary, device_key, "127.0.0.1", server1.port)
    assert exist_address(summary, device_key, "test_addr", server2.port)

    remote = client.request(device_key)
    summary = client.summary()
    assert summary["queue_info"][device_key]["free"] == 1

    del remote
    time.sleep(1)

    summary = client.summary()
    assert summary["queue_info"][device_key]["free"] == 2

    server1.terminate()
    time.sleep(1)

    summary = client.summary()
    assert summary["queue_info"][device_key]["free"] == 1
    assert not exist_address(summary, device_key, "127.0.0.1", server1.port)
    assert exist_address(summary, device_key, "test_addr", server2.port)

    server2.terminate()
    time.sleep(1)

    summary = client.summary()
    assert summary["queue_info"][device_key]["free"] == 0
    assert not exist_address(summary, device_key, "test_addr", server2.port)

    tracker.terminate()


def _target(host, port, device_key, timeout):
    client = rpc.connect_tracker(host, port)
    remote = client.request(device_key, session_timeout=timeout)
    while True:
        pass
    remote.cpu()


@pytest.mark.parametrize("device_key", ["test_device", "127.0.0.1:5555"])
def test_rpc_tracker_request(device_key):
    # test concurrent request
    tracker = Tracker(port=9000, port_end=10000)
    server = rpc.Server(
        port=9000,
        port_end=10000,
        key=device_key,
        tracker_addr=("127.0.0.1", tracker.port),
    )
    client = rpc.connect_tracker("127.0.0.1", tracker.port)

    proc1 = multiprocessing.Process(target=_target, args=("127.0.0.1", tracker.port, device_key, 4))
    proc2 = multiprocessing.Process(
        target=_target, args=("127.0.0.1", tracker.port, device_key, 200)
    )
    proc1.start()
    time.sleep(0.5)
    proc2.start()
    time.sleep(0.5)

    summary = client.summary()

    assert summary["queue_info"][device_key]["free"] == 0
    assert summary["queue_info"][device_key]["pending"] == 1

    proc1.terminate()
    proc1.join()
    time.sleep(0.5)

    summary = client.summary()
    assert summary["queue_info"][device_key]["free"] == 0
    assert summary["queue_info"][device_key]["pending"] == 0

    proc2.terminate()
    proc2.join()
    server.terminate()
    tracker.terminate()


@pytest.fixture
def proxy_token(tmp_path, monkeypatch):
    # kiln's proxy admits daemons by a token: the fleet of a proxy test
    # (tracker, proxy, daemons, clients) reads one from KILN_TOKEN_FILE.
    token = tmp_path / "token"
    token.write_text(os.urandom(16).hex())
    monkeypatch.setenv("KILN_TOKEN_FILE", str(token))


@pytest.mark.parametrize("device_key", ["test_device", "127.0.0.1:5555"])
def test_rpc_tracker_via_proxy(device_key, proxy_token):
    """
         tracker
         /     \
    Host   --   Proxy -- RPC server
    """

    tracker_server = Tracker(port=9000, port_end=9100)
    proxy_server = Proxy(
        host=tracker_server.host,
        port=8888,
        port_end=8988,
        tracker_addr=(tracker_server.host, tracker_server.port),
    )

    server1 = rpc.Server(
        host=proxy_server.host,
        port=proxy_server.port,
        key=device_key,
        tracker_addr=(tracker_server.host, tracker_server.port),
        is_proxy=True,
    )
    server2 = rpc.Server(
        host=proxy_server.host,
        port=proxy_server.port,
        key=device_key,
        tracker_addr=(tracker_server.host, tracker_server.port),
        is_proxy=True,
    )

    client = rpc.connect_tracker(tracker_server.host, tracker_server.port)
    remote1 = client.request(device_key, session_timeout=30)  # pylint: disable=unused-variable
    remote2 = client.request(device_key, session_timeout=30)  # pylint: disable=unused-variable

    server2.terminate()
    server1.terminate()
    proxy_server.terminate()
    tracker_server.terminate()


def test_rpc_proxy_connect_by_key(proxy_token):
    """TVM's tests/python/contrib/test_rpc_proxy.py: a client connects to
    the proxy with a key and reaches the server that registered that key
    (the server is a daemon behind the proxy, rpc.Server(is_proxy=True),
    in place of TVM's websocket server)."""
    prox = Proxy("127.0.0.1", port=9091, port_end=9199)
    server = rpc.Server(host=prox.host, port=prox.port, is_proxy=True, key="x1")
    other = rpc.Server(host=prox.host, port=prox.port, is_proxy=True, key="x2")

    client = rpc.connect(prox.host, prox.port, key="x1")
    f1 = client.get_function("testing.echo")
    assert f1(10) == 10
    assert f1("xyz") == "xyz"
    assert client.info["addr"] == f"{server.host}:{server.port}"
    client2 = rpc.connect(prox.host, prox.port, key="x2")
    assert client2.info["addr"] == f"{other.host}:{other.port}"

    # No board with that key; no key at all at the proxy's port.
    with pytest.raises(tvm.error.RPCError, match='no board with key "x3" is connected to the proxy'):
        rpc.connect(prox.host, prox.port, key="x3")
    with pytest.raises(tvm.error.RPCError, match="this port is for device daemons"):
        rpc.connect(prox.host, prox.port)

    client.close()
    client2.close()
    other.terminate()
    server.terminate()
    prox.terminate()


def test_rpc_proxy_restarted_daemon_serves_again(proxy_token):
    # kiln's own: the proxy process is killed and started again on the same
    # port; the daemon behind it connects again and is reached by its key.
    prox = Proxy("127.0.0.1", port=9091, port_end=9199)
    port = prox.port
    server = rpc.Server(host=prox.host, port=prox.port, is_proxy=True, key="x1")
    assert rpc.connect(prox.host, port, key="x1").get_function("testing.echo")(1) == 1
    prox.proc.kill()
    prox.terminate()

    prox = Proxy("127.0.0.1", port=port, port_end=port)
    deadline = time.monotonic() + 60
    while True:
        try:
            client = rpc.connect(prox.host, port, key="x1")
            break
        except tvm.error.RPCError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    assert client.get_function("testing.echo")(2) == 2
    assert client.info["addr"] == f"{server.host}:{server.port}"
    client.close()
    server.terminate()
    prox.terminate()


@pytest.mark.parametrize("with_proxy", (True, False))
def test_rpc_session_timeout_error(with_proxy, proxy_token):
    port = 9000
    port_end = 10000

    tracker = Tracker(port=port, port_end=port_end)
    time.sleep(0.5)
    tracker_addr = (tracker.host, tracker.port)

    if with_proxy:
        # TVM's test binds every interface; kiln's tests stay on loopback.
        proxy = Proxy(host="127.0.0.1", port=port, port_end=port_end, tracker_addr=tracker_addr)
        time.sleep(0.5)
        server = rpc.Server(host=proxy.host, port=proxy.port, is_proxy=True, key="x1")
    else:
        server = rpc.Server(port=port, port_end=port_end, tracker_addr=tracker_addr, key="x1")
    time.sleep(0.5)

    rpc_sess = rpc.connect_tracker(*tracker_addr).request(key="x1", session_timeout=1)

    with pytest.raises(tvm.error.RPCSessionTimeoutError):
        f1 = rpc_sess.get_function("rpc.test.addone")
        time.sleep(2)
        f1(10)

    server.terminate()
    if with_proxy:
        proxy.terminate()
    tracker.terminate()


ZERO_ARGS = """
@I.ir_module
class Module:
    @T.prim_func
    def func_without_arg() -> T.int64:
        return T.int64(42)

    @T.prim_func
    def func_with_arg(unused: T.int64) -> T.int64:
        return T.int64(42)
"""


@pytest.mark.parametrize("call_with_unused_argument", [True, False])
def test_compiled_function_with_zero_arguments(call_with_unused_argument, tmp_path):
    """RPC functions do not require an argument"""
    path = tvm.build(ZERO_ARGS, target="llvm", output=str(tmp_path / "zero_args.kiln"), progress=False)
    built = tvm.runtime.load_module(path)
    built.artifact = path

    server = tvm.rpc.Server(key="x1")
    client = tvm.rpc.connect("127.0.0.1", server.port, key="x1")

    libname = "libbuilt.so"
    with tempfile.TemporaryDirectory(prefix="tvm_rpc_testing_") as temp_dir:
        local_path = os.path.join(temp_dir, libname)
        built.export_library(local_path)
        client.upload(local_path)

    remote_mod = client.load_module(libname)

    if call_with_unused_argument:
        res = remote_mod["func_with_arg"](0)
    else:
        res = remote_mod["func_without_arg"]()

    assert res == 42


def test_fork_after_use_reinitialises_the_library():
    # TVM's tracker tests fork; a child forked after the parent used kiln
    # gets a library of its own and works.
    s = rpc.LocalSession()
    assert s.get_function("rpc.test.addone")(1) == 2
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()

    def child(q):
        q.put(rpc.LocalSession().get_function("rpc.test.addone")(41))

    p = ctx.Process(target=child, args=(q,))
    p.start()
    try:
        assert q.get(timeout=120) == 42
    finally:
        p.join(120)
    assert p.exitcode == 0
    assert s.get_function("rpc.test.addone")(2) == 3
