"""kiln.IRModule: a module of tensor programs as TVMScript text, named
after TVM's ``tvm.IRModule``."""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any, Mapping, Optional, Union

from . import _lib
from ._lib import lib
from .errors import KilnValueError

if TYPE_CHECKING:
    from .tir import PrimFunc


def _function_text(script: str, name: str = "", rename: str = "") -> str:
    """The PrimFunc name of a module's text (its only one when name is
    empty) as a module of that function, renamed to rename."""
    out = ctypes.c_void_p()
    _lib.check(lib.kiln_tir_function(script.encode(), name.encode(), rename.encode(), ctypes.byref(out)))
    return _lib.take_string(out)


class IRModule:
    """A module: TVMScript text that libkiln parses, schedules and builds.
    ``IRModule({"main": func})`` wraps a PrimFunc; ``mod["main"]`` is one;
    ``mod.script()`` is the text and ``mod.show()`` prints it."""

    def __init__(self, functions: Union[Mapping[str, "PrimFunc"], str, None] = None) -> None:
        from .tir import PrimFunc

        if isinstance(functions, str):
            self._text = functions
            return
        if not functions:
            raise KilnValueError("IRModule: give a function, {\"main\": func}, or TVMScript text")
        if len(functions) != 1:
            raise KilnValueError(f"IRModule: kiln builds modules of one PrimFunc here, got {len(functions)}")
        ((name, func),) = functions.items()
        if not isinstance(func, PrimFunc):
            raise KilnValueError(f"IRModule: {name!r} is a {type(func).__name__}, want a kiln.tir.PrimFunc")
        self._text = _function_text(func.script(), "", name)

    @staticmethod
    def from_expr(func: "PrimFunc") -> "IRModule":
        return IRModule({func.name: func})

    def __getitem__(self, name: str) -> "PrimFunc":
        from .tir import PrimFunc

        return PrimFunc(_function_text(self._text, name))

    def script(self, **_: Any) -> str:
        """The module's TVMScript text."""
        return self._text

    def show(self, file: Optional[Any] = None) -> None:
        """Prints the module's text."""
        print(self._text, file=file)

    def __str__(self) -> str:
        return self._text

    def __repr__(self) -> str:
        return self._text
