"""TVM's cross-compilation and RPC tutorial
(docs/how_to/tutorials/cross_compilation_and_rpc.py), in
python/examples/cross_compilation_and_rpc.py with only its imports
changed, runs as written; and the same script against a device daemon on
loopback, its rpc.LocalSession() swapped for rpc.connect(host, port) as
the tutorial tells a reader with a board to do."""

import os
import runpy


from conftest import EXAMPLES

TUTORIAL = os.path.join(EXAMPLES, "cross_compilation_and_rpc.py")


def test_tutorial_as_written(capsys):
    runpy.run_path(TUTORIAL, run_name="__main__")
    out = capsys.readouterr().out
    assert "secs/op" in out, out


def test_tutorial_against_a_daemon(kiln_binary, monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("KILN_BINARY", kiln_binary)
    from kiln import rpc

    server = rpc.Server(key="board")
    try:
        with open(TUTORIAL) as f:
            src = f.read()
        local = "    remote = rpc.LocalSession()\n"
        assert src.count(local) == 1
        src = src.replace(local, f"    remote = rpc.connect(\"127.0.0.1\", {server.port})\n")
        path = tmp_path / "tutorial_remote.py"
        path.write_text(src)
        runpy.run_path(str(path), run_name="__main__")
        out = capsys.readouterr().out
        assert "secs/op" in out, out
    finally:
        server.terminate()
