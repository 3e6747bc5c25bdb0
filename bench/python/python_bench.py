"""The Python half of `go run ./bench python`: times the kiln package over
libkiln.so and prints one JSON object. Run by bench/python.go, which passes
the daemon's address, the sizes, and KILN_LIBRARY/PYTHONPATH."""

import json
import sys
import time

import numpy as np

import kiln

EMPTY = '''
@T.prim_func
def empty(A: T.Buffer((1,), "float32")):
    T.evaluate(0)
'''


def median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2]


def main():
    addr, calls, size, uploads, out_dir = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    host, _, port = addr.rpartition(":")
    res = {}

    # The empty kernel, built here, for the local calls (and the C harness).
    path = kiln.build(EMPTY, output=out_dir + "/empty.kiln", progress=False)
    f = kiln.local().load_module(path)["empty"]
    a = kiln.nd.empty((1,), "float32")
    for _ in range(1000):
        f(a)
    best = float("inf")
    n = max(calls, 1000)
    for _ in range(5):
        start = time.perf_counter_ns()
        for _ in range(n):
            f(a)
        best = min(best, (time.perf_counter_ns() - start) / n / 1e3)
    res["local_call_us"] = best

    with kiln.rpc.connect(host, int(port)) as remote:
        nop = remote.get_function("rpcserver.nop")
        for _ in range(min(calls // 10, 500) or 1):
            nop()
        lat = []
        clock = time.perf_counter_ns
        for _ in range(calls):
            t0 = clock()
            nop()
            lat.append(clock() - t0)
        res["remote_call_median_us"] = median(lat) / 1e3

        # Fresh, page-aligned memory, as the Go side's make([]byte).
        block = min(size, 1 << 16)
        x = np.empty(size, np.uint8)
        x[:] = np.tile(np.frombuffer(bytes((i * 7 + (i >> 13)) & 0xFF for i in range(block)), np.uint8), size // block)
        arr = kiln.nd.empty((x.size,), "uint8", remote.cpu(0))
        arr.copyfrom(x)  # warm the connection and the daemon's buffers
        rates = []
        for _ in range(uploads):
            t0 = time.perf_counter_ns()
            arr.copyfrom(x)
            rates.append(x.size / ((time.perf_counter_ns() - t0) / 1e9) / 1e9)
        res["upload_gbps"] = median(rates)
        back = arr.numpy()
        if not np.array_equal(back, x):
            raise SystemExit("the uploaded array came back different")
        arr.free()
    res["live_handles"] = kiln.live_handles()
    json.dump(res, sys.stdout)


main()
