"""tvm.support on kiln: utils.tempdir, as TVM's examples use it."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import types
from typing import Optional


class TempDirectory:
    """A temporary directory removed when the object goes (TVM's
    tvm.support.utils.tempdir()); relpath(name) is a path inside it."""

    def __init__(self, custom_path: Optional[str] = None, keep_for_debug: bool = False) -> None:
        if custom_path:
            os.makedirs(custom_path, exist_ok=True)
            self.temp_dir = custom_path
        else:
            self.temp_dir = tempfile.mkdtemp(prefix="kiln-tempdir-")
        self._keep = keep_for_debug or bool(custom_path)

    def relpath(self, name: str) -> str:
        return os.path.join(self.temp_dir, name)

    def listdir(self) -> list:
        return os.listdir(self.temp_dir)

    def remove(self) -> None:
        if not self._keep and self.temp_dir:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
            self.temp_dir = ""

    def __enter__(self) -> "TempDirectory":
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()

    def __del__(self) -> None:
        try:
            self.remove()
        except Exception:
            pass


def tempdir(custom_path: Optional[str] = None, keep_for_debug: bool = False) -> TempDirectory:
    """A new temporary directory (tvm.support.utils.tempdir)."""
    return TempDirectory(custom_path, keep_for_debug)


utils = types.ModuleType(__name__ + ".utils", "tvm.support.utils on kiln.")
utils.tempdir = tempdir  # type: ignore[attr-defined]
utils.TempDirectory = TempDirectory  # type: ignore[attr-defined]
sys.modules[utils.__name__] = utils
