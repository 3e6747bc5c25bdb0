package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
)

// referencePython is the interpreter that runs the reference peers (numpy
// with OpenBLAS, PyTorch on CPU): Debian's, where those packages install.
// KILN_BENCH_PYTHON overrides it.
func referencePython() string {
	if p := os.Getenv("KILN_BENCH_PYTHON"); p != "" {
		return p
	}
	return "/usr/bin/python3"
}

// errNoReference says the reference peer cannot run here (no Python or no
// numpy); benchmarks then report their own figures without a ratio.
var errNoReference = errors.New("reference peer unavailable")

// numpyReference is the Python side of the numpy comparisons. It prints one
// JSON object: the median over repeats of the figure each op defines.
const numpyReference = `
import json, sys, time
import numpy as np
op = sys.argv[1]
args = [int(a) for a in sys.argv[2:]]
rng = np.random.default_rng(0)
def timed(fn, repeats, min_s):
    fn()
    out = []
    for _ in range(repeats):
        n = 1
        while True:
            t = time.perf_counter()
            for _ in range(n):
                fn()
            dt = time.perf_counter() - t
            if dt >= min_s:
                break
            n = max(n * 2, int(n * min_s / max(dt, 1e-9)) + 1)
        out.append(dt / n)
    out.sort()
    return out[len(out) // 2]
res = {"numpy": np.__version__}
try:
    cfg = np.show_config(mode="dicts")
    res["blas"] = cfg["Build Dependencies"]["blas"]["name"]
except Exception:
    pass
try:
    # The BLAS numpy loaded, and the kernels a DYNAMIC_ARCH OpenBLAS chose.
    import ctypes
    libs = sorted({l.split()[-1] for l in open("/proc/self/maps") if "blas" in l.rsplit("/", 1)[-1]})
    for lib in libs:
        try:
            f = ctypes.CDLL(lib).openblas_get_corename
        except (OSError, AttributeError):
            continue
        f.restype = ctypes.c_char_p
        res.setdefault("blas", "openblas")
        res["blas_core"] = f().decode()
        break
    else:
        if libs:
            res.setdefault("blas", libs[0].rsplit("/", 1)[-1])
except Exception:
    pass
if op == "matmul":
    n, m, k, repeats = args
    a = rng.random((n, k), dtype=np.float32)
    b = rng.random((k, m), dtype=np.float32)
    c = np.empty((n, m), dtype=np.float32)
    s = timed(lambda: np.matmul(a, b, out=c), repeats, 0.2)
    res["seconds"] = s
    res["gflops"] = 2.0 * n * m * k / s / 1e9
elif op == "vecadd":
    n, repeats = args
    a = rng.random(n, dtype=np.float32)
    b = rng.random(n, dtype=np.float32)
    c = np.empty(n, dtype=np.float32)
    s = timed(lambda: np.add(a, b, out=c), repeats, 0.2)
    res["seconds"] = s
    res["gbps"] = 3.0 * 4 * n / s / 1e9
elif op == "copy":
    n, repeats = args
    a = rng.random(n, dtype=np.float32)
    c = np.empty(n, dtype=np.float32)
    s = timed(lambda: np.copyto(c, a), repeats, 0.2)
    res["seconds"] = s
    res["gbps"] = 2.0 * 4 * n / s / 1e9
else:
    raise SystemExit("unknown op " + op)
print(json.dumps(res))
`

// runNumpy runs one numpy reference measurement and decodes its JSON.
func runNumpy(ctx context.Context, op string, args ...int) (map[string]any, error) {
	return runNumpyEnv(ctx, nil, op, args...)
}

// runNumpyEnv is runNumpy with env added to the peer's environment (such
// as numpyEnv's OPENBLAS_CORETYPE).
func runNumpyEnv(ctx context.Context, env []string, op string, args ...int) (map[string]any, error) {
	py := referencePython()
	if _, err := exec.LookPath(py); err != nil {
		return nil, fmt.Errorf("%w: %s not found", errNoReference, py)
	}
	cmdArgs := []string{"-c", numpyReference, op}
	for _, a := range args {
		cmdArgs = append(cmdArgs, strconv.Itoa(a))
	}
	cmd := exec.CommandContext(ctx, py, cmdArgs...)
	if len(env) > 0 {
		cmd.Env = append(os.Environ(), env...)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		msg := strings.TrimSpace(stderr.String())
		if strings.Contains(msg, "No module named 'numpy'") {
			return nil, fmt.Errorf("%w: %s has no numpy (apt-get install python3-numpy libopenblas0-pthread)", errNoReference, py)
		}
		return nil, fmt.Errorf("numpy reference %s: %w: %s", op, err, msg)
	}
	var res map[string]any
	if err := json.Unmarshal(out, &res); err != nil {
		return nil, fmt.Errorf("numpy reference %s: bad output %q: %w", op, out, err)
	}
	if blas, _ := res["blas"].(string); op == "matmul" && !strings.EqualFold(blas, "openblas") {
		// Debian's numpy alone loads the reference BLAS, tens of times
		// slower: a ratio to it says nothing about kiln.
		if blas == "" {
			blas = "unknown"
		}
		return nil, fmt.Errorf("%w: %s's numpy uses BLAS %s, not OpenBLAS (apt-get install libopenblas0-pthread)", errNoReference, py, blas)
	}
	return res, nil
}

// num reads a number from a decoded reference result (0 when absent).
func num(m map[string]any, key string) float64 {
	v, _ := m[key].(float64)
	return v
}
