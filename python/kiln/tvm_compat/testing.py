"""tvm.testing on kiln: the assertion helpers TVM's tests use."""

from __future__ import annotations

from typing import Any

import numpy as np


def assert_allclose(actual: Any, desired: Any, rtol: float = 1e-7, atol: float = 1e-7, verbose: bool = True) -> None:
    """numpy's assert_allclose on arrays or kiln arrays (TVM's
    tvm.testing.assert_allclose; its shape check included)."""
    actual = actual.numpy() if hasattr(actual, "numpy") else np.asanyarray(actual)
    desired = desired.numpy() if hasattr(desired, "numpy") else np.asanyarray(desired)
    np.testing.assert_allclose(actual.shape, desired.shape)
    np.testing.assert_allclose(actual, desired, rtol=rtol, atol=atol, verbose=verbose)
