"""TVM's RPC idioms with kiln: connect to a tracker, request a device, upload
an artifact built through the tracker, load it, run and time the matrix
multiply of TVM's tensor-expression tutorial and compare with numpy.

With TVM this would be `from tvm import rpc` and `tvm.nd`; with kiln only
the imports change:

    KILN_TRACKER=127.0.0.1:9190 KILN_TOKEN_FILE=token python3 tvm_style.py

(the fleet of the README's "A fleet" section serves it).
"""

import os
import sys

import numpy as np

import kiln
from kiln import rpc

host, _, port = os.environ.get("KILN_TRACKER", "127.0.0.1:9190").rpartition(":")
key = os.environ.get("KILN_KEY", "cpu")
here = os.path.dirname(os.path.abspath(__file__))

# Build the module on a compiler node of the fleet.
tracker = rpc.connect_tracker(host, int(port))
path = kiln.build(os.path.join(here, "matmul.py"), target="cpu", tracker=tracker,
                  output=os.path.join(os.environ.get("TMPDIR", "/tmp"), "tvm_style_matmul.kiln"))

# Lease a device, upload and load the artifact.
remote = tracker.request(key, priority=1, session_timeout=60)
remote.upload(path)
func = remote.load_module(os.path.basename(path))

# numpy in, run, numpy out.
dev = remote.cpu(0)
n, k, m = 128, 128, 128
a_np = np.random.uniform(size=(n, k)).astype("float32")
b_np = np.random.uniform(size=(k, m)).astype("float32")
a = kiln.nd.array(a_np, dev)
b = kiln.nd.array(b_np, dev)
c = kiln.nd.array(np.zeros((n, m), dtype="float32"), dev)
func["matrix_multiply"](a, b, c)
np.testing.assert_allclose(c.numpy(), a_np @ b_np, rtol=1e-5)
print("the result matches numpy")

# Time it on the device.
ftimer = func.time_evaluator("matrix_multiply", dev, number=10, repeat=3, min_repeat_ms=50)
prof = ftimer(a, b, c)
print(prof)
print("%.3f ms per call, %.2f GFLOPS" % (prof.mean * 1e3, 2 * n * k * m / prof.mean / 1e9))
remote.close()
tracker.close()
sys.exit(0)
