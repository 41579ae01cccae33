"""Counting host reads: the places where a computation waits for a tensor's value on the host.

On a GPU each read is a stream synchronisation (one host round trip); on a CPU nothing waits, but the same
reads happen, so a CPU test or benchmark can count where a GPU run would stall. One counter sees both kinds:

- reads from Python (``bool``/``int``/``float``/``index`` of a tensor, ``item``, ``tolist``, ``nonzero``,
  ``unique``, ``masked_select``, ``torch.equal``, boolean-mask indexing), through a ``TorchFunctionMode``;
- reads made inside an operator or the C++ extension (``aten::_local_scalar_dense``, ``nonzero``,
  ``unique``, ``masked_select``, ``equal``, ``is_nonzero``), through a ``TorchDispatchMode``.

A Python read reaches the dispatcher too; it is counted once, under its Python name.

    with HostReadCounter() as counter:
        construct(K, V, f, outputs="values")
    counter.count, collections.Counter(counter.reads)
"""

from __future__ import annotations

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

PYTHON_READS = frozenset({"__bool__", "__int__", "__float__", "__index__", "item", "tolist", "nonzero", "unique",
                          "unique_consecutive", "masked_select", "equal"})
OPERATOR_READS = ("local_scalar_dense", "nonzero", "unique", "masked_select", "equal", "is_nonzero")
NOT_READS = ("nonzero_static",)  # its output size is given: nothing waits


def _is_mask_index(name: str, args: tuple) -> bool:
    return (name == "__getitem__" and len(args) > 1 and isinstance(args[1], torch.Tensor)
            and args[1].dtype == torch.bool)


class _OperatorReads(TorchDispatchMode):
    def __init__(self, counter: "HostReadCounter") -> None:
        super().__init__()
        self.counter = counter

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0].lstrip("_")
        if (self.counter._inside_python_read == 0 and name.startswith(OPERATOR_READS)
                and not name.startswith(NOT_READS)):
            self.counter.reads.append(f"aten::{name}")
        return func(*args, **(kwargs or {}))


class _PythonReads(TorchFunctionMode):
    def __init__(self, counter: "HostReadCounter") -> None:
        super().__init__()
        self.counter = counter

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name not in PYTHON_READS and not _is_mask_index(name, args):
            return func(*args, **(kwargs or {}))
        if self.counter._inside_python_read == 0:
            self.counter.reads.append(name)
        self.counter._inside_python_read += 1
        try:
            return func(*args, **(kwargs or {}))
        finally:
            self.counter._inside_python_read -= 1


class HostReadCounter:
    """Context manager counting host reads (see the module docstring); ``reads`` lists them in order."""

    def __init__(self) -> None:
        self.reads: list[str] = []
        self._inside_python_read = 0
        self._modes = (_OperatorReads(self), _PythonReads(self))

    @property
    def count(self) -> int:
        return len(self.reads)

    def __enter__(self) -> "HostReadCounter":
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        for mode in reversed(self._modes):
            mode.__exit__(*exc)
