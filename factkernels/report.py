"""The construction report: what a construction built and measured, one schema for every path
(:func:`factkernels.construct`, :func:`factkernels.distributed.construct_sharded` and
:class:`factkernels.FactBuilder`)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Optional


@dataclass
class ConstructionReport:
    """What ``construct`` (or ``construct_sharded``, or a ``FactBuilder`` change) built and measured.
    ``str(report)`` prints a table.

    ``accuracy``, ``failed`` and ``min_margin`` are over the verified facts (None when not verified):
    all of them, or the ``checked`` ones a FactBuilder change touched (``checked`` None: all facts);
    ``world_size`` is the number of processes the facts were sharded over (1 for ``construct``).
    """

    num_facts: int
    num_values: int
    d_in: int
    d_out: int
    m: int
    m_search: str
    rho: float
    outputs: str
    hidden: int
    gadget_width: int
    width_multiplier: float
    params: int
    activation: str
    solver: str
    precision: str
    residual: float
    cg_iterations: int
    whiten_alpha: float
    backend: str
    device: str
    verified: bool
    accuracy: Optional[float] = None
    failed: Optional[int] = None
    min_margin: Optional[float] = None
    timings: dict = field(default_factory=dict)
    world_size: int = 1
    checked: Optional[int] = None
    cg_preconditioner: str = ""  # the CG solve's (factkernels.solvers.PRECONDITIONERS), "" for other solvers

    def to_dict(self) -> dict:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def __str__(self) -> str:
        rows = [
            ("facts / values", f"{self.num_facts} / {self.num_values}"),
            ("dims (in -> out)", f"{self.d_in} -> {self.d_out}"),
            ("accuracy", "not verified" if self.accuracy is None else f"{self.accuracy:.2%} ({self.failed} failed"
                         + ("" if self.checked is None else f" of {self.checked} checked") + ")"),
            ("min margin", "-" if self.min_margin is None else f"{self.min_margin:.4g}"),
            ("rho (outputs)", f"{self.rho:.4f} ({self.outputs})"),
            ("m", f"{self.m} ({self.m_search})"),
            ("hidden size", f"{self.hidden} = {self.m} gadgets x {self.gadget_width} (multiplier {self.width_multiplier})"),
            ("parameters", f"{self.params:,}"),
            ("activation", self.activation),
            ("solver", f"{self.solver} [{self.precision}]" + (f", {self.cg_iterations} iterations" if self.cg_iterations else "")
             + (f", {self.cg_preconditioner} preconditioner" if self.cg_preconditioner else "")),
            ("relative residual", f"{self.residual:.2e}"),
            ("whitening alpha", f"{self.whiten_alpha:g}"),
            ("backend / device", f"{self.backend} / {self.device}"),
        ]
        if self.world_size > 1:
            rows.append(("processes", str(self.world_size)))
        rows += [(f"time: {k}", f"{v * 1e3:.1f} ms") for k, v in self.timings.items()]
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)

    @classmethod
    def from_dict(cls, data: dict) -> "ConstructionReport":
        return cls(**data)


class FactStorageError(RuntimeError):
    """Raised by ``construct(..., verify=True)`` (and ``construct_sharded``, ``FactBuilder``) when some
    facts are not stored; ``report`` is the :class:`ConstructionReport` of the failed build."""

    def __init__(self, message: str, report: Optional["ConstructionReport"]) -> None:
        super().__init__(message)
        self.report = report
