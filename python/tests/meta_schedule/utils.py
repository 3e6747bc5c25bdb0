"""TVM's meta_schedule/utils.py functions the runner uses, as TVM
writes them, over kiln.tvm_compat's registry."""

from __future__ import annotations

from typing import Callable, Optional, Union

from kiln.tvm_compat import get_global_func
from kiln.tvm_compat.rpc import RPCSession


def get_global_func_with_default_on_worker(
    name: Union[None, str, Callable],
    default: Callable,
) -> Callable:
    if name is None:
        return default
    if callable(name):
        return name
    try:
        return get_global_func(name)
    except (ValueError, RuntimeError, AttributeError) as error:
        raise ValueError(
            "Function '{name}' is not registered on the worker process. "
            "The build function and export function should be registered in the worker process. "
            "Note that the worker process is only aware of functions registered in TVM package, "
            "if there are extra functions to be registered, "
            "please send the registration logic via initializer."
        ) from error


def get_global_func_on_rpc_session(
    session: RPCSession,
    name: str,
    extra_error_msg: Optional[str] = None,
) -> Callable:
    try:
        result = session.get_function(name)
    except AttributeError as error:
        error_msg = f'Unable to find function "{name}" on the remote RPC server.'
        if extra_error_msg:
            error_msg = f"{error_msg} {extra_error_msg}"
        raise AttributeError(error_msg) from error
    return result
