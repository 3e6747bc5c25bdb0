"""Builds libkiln.so with the Go toolchain while the package is built.

The library is kiln's C API (the capi package of the Go module this
directory sits in), built with `go build -buildmode=c-shared`. GOOS/GOARCH,
CC and CGO_* from the environment pass through, so a wheel for another
architecture is built with, for example,

    CC=aarch64-linux-gnu-gcc GOARCH=arm64 pip wheel --no-build-isolation ./python \
        --build-option=--plat-name=manylinux2014_aarch64

KILN_SOURCE names the Go module's directory when this one is not inside it.
"""

import os
import shutil
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))


def go_module_root() -> str:
    env = os.environ.get("KILN_SOURCE")
    if env:
        return env
    d = HERE
    while True:
        gomod = os.path.join(d, "go.mod")
        if os.path.exists(gomod):
            with open(gomod) as f:
                if "module github.com/kiln-ml/kiln" in f.read():
                    return d
        parent = os.path.dirname(d)
        if parent == d:
            break
        d = parent
    sys.exit(
        "kiln: cannot find kiln's Go module (go.mod) above "
        + HERE
        + "; build from a clone of the repository or set KILN_SOURCE"
    )


class BuildWithGo(build_py):
    """build_py that also builds libkiln.so into the package."""

    def run(self) -> None:
        super().run()
        go = shutil.which("go") or ("/usr/local/go/bin/go" if os.path.exists("/usr/local/go/bin/go") else None)
        if go is None:
            sys.exit("kiln: building libkiln.so needs the Go toolchain (go 1.26, https://go.dev/dl/) on PATH")
        root = go_module_root()
        out = os.path.join(os.path.abspath(self.build_lib), "kiln", "libkiln.so")
        os.makedirs(os.path.dirname(out), exist_ok=True)
        env = dict(os.environ, CGO_ENABLED="1")
        cmd = [go, "build", "-trimpath", "-buildmode=c-shared", "-o", out, "./capi"]
        print("kiln: " + " ".join(cmd) + " (in " + root + ")", flush=True)
        subprocess.run(cmd, cwd=root, env=env, check=True)
        header = os.path.splitext(out)[0] + ".h"
        if os.path.exists(header):
            os.remove(header)  # cgo's generated header; capi/kiln.h is the documented one


class BinaryDistribution(Distribution):
    """The wheel holds a native library: it is tagged for one platform."""

    def has_ext_modules(self) -> bool:
        return True


setup(cmdclass={"build_py": BuildWithGo}, distclass=BinaryDistribution)
