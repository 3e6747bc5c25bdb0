"""An ONNX model (the small CNN kiln's ONNX importer is tested with) built
from Python, here and through the tracker, run and compared with the
expected output numpy computed independently."""

import gc
import os

import numpy as np
import pytest

import kiln
from conftest import REPO

DATA = os.path.join(REPO, "compiler", "frontend", "onnx", "testdata")
MODEL = os.path.join(DATA, "smallcnn.onnx")


def check_run(session, path, dev):
    x = np.load(os.path.join(DATA, "smallcnn_x.npy"))
    want = np.load(os.path.join(DATA, "smallcnn_y.npy"))
    mod = session.load_module(path)
    assert "main" in mod.functions
    y = mod["main"](kiln.nd.array(x, dev))
    np.testing.assert_allclose(y.numpy(), want, rtol=1e-4, atol=1e-5)


def test_onnx_local(tmp_path):
    path = kiln.build(MODEL, output=str(tmp_path / "cnn.kiln"), input_shapes={"x": (2, 3, 16, 16)}, progress=False)
    check_run(kiln.local(), path, kiln.cpu(0))


def test_onnx_through_the_tracker_on_a_leased_device(tracker, remote, tmp_path):
    path = kiln.build(MODEL, tracker=tracker, output=str(tmp_path / "cnn.kiln"), input_shapes={"x": (2, 3, 16, 16)},
                      progress=False)
    check_run(kiln.local(), path, kiln.cpu(0))
    remote.upload(path)
    check_run(remote, "cnn.kiln", remote.cpu(0))  # the weights go to the device once
    gc.collect()
    before = kiln.live_handles()
    mod = remote.load_module("cnn.kiln")
    x = kiln.nd.array(np.load(os.path.join(DATA, "smallcnn_x.npy")), remote.cpu(0))
    with pytest.raises(kiln.KilnValueError, match="want the inputs x"):
        mod["main"](x, x)
    r = mod.time_evaluator("main", remote.cpu(0), number=2, repeat=2)(x)
    assert len(r.results) == 2
    del mod, x
    gc.collect()
    assert kiln.live_handles() == before


def test_onnx_symbolic_dimension_without_a_shape(tmp_path):
    with pytest.raises(kiln.BuildError, match="x"):
        kiln.build(MODEL, output=str(tmp_path / "cnn.kiln"), progress=False)
    with pytest.raises(kiln.KilnValueError, match="input_shapes is for ONNX"):
        kiln.build(os.path.join(REPO, "python", "examples", "matmul.py"), input_shapes={"x": (1,)})
