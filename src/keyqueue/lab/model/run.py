"""``keyqueue lab model``: the fluid view of capacity, and M/M/1 when it applies.

Theory of operation
-------------------
The fluid view treats keys as a liquid: λ arrive per step, the workers can
take μ per step, and the backlog carries the difference forward. It is exact
for steady traffic and says the one thing that matters first: if λ > μ the
backlog grows by λ - μ every step, forever; if λ < μ it clears at
``backlog / (μ - λ)``.

When λ < μ, M/M/1 adds what randomness costs on top: with utilisation
rho = λ/μ there are on average ``L = rho / (1 - rho)`` keys in the system and each
spends ``W = 1 / (μ - λ)`` in it (Little: L = λW). Those figures assume
Poisson arrivals and exponential service, and, for this queue, λ counts
distinct keys becoming ready, not raw events: adds to a key that is already
waiting are coalesced and cost nothing.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

__all__ = [
    "KEYS_NOTE",
    "MM1",
    "ModelResult",
    "ModelStep",
    "POISSON_WARNING",
    "prediction",
    "run_model",
]

POISSON_WARNING = (
    "Warning: these M/M/1 estimates rest on Poisson assumptions (random, independent "
    "arrivals; exponentially distributed service times, one key at a time); real "
    "traffic is often burstier."
)
KEYS_NOTE = (
    "λ counts distinct keys becoming ready, not raw events: adds to a key that is "
    "already waiting are coalesced and cost the workers nothing, so a firehose of "
    "events on a few keys is a small λ."
)

MAX_AUTO_STEPS = 12


@dataclass(frozen=True, slots=True)
class ModelStep:
    """One step of the fluid model."""

    t: int
    backlog: float
    """Keys waiting at the end of step ``t`` (``t = 0``: the initial backlog)."""
    served: float
    """Keys served during step ``t`` (0 at ``t = 0``)."""
    utilisation: float
    """``served / μ``: how busy the workers were during step ``t``."""


@dataclass(frozen=True, slots=True)
class MM1:
    """Steady-state M/M/1 estimates (only when λ < μ)."""

    rho: float
    """Utilisation λ/μ."""
    mean_in_system: float
    """L = rho / (1 - rho): keys waiting or being served, on average."""
    mean_time_in_system: float
    """W = 1 / (μ - λ): how long a key spends from ready to done, on average."""
    mean_waiting: float
    """Lq = rho² / (1 - rho): keys waiting, on average."""
    mean_wait: float
    """Wq = rho / (μ - λ): how long a key waits before a worker takes it."""


@dataclass(frozen=True, slots=True)
class ModelResult:
    arrival: float
    """λ: keys becoming ready per step."""
    service: float
    """μ: keys the workers can finish per step."""
    backlog: float
    """Keys waiting at t = 0."""
    utilisation: float
    """Offered load λ/μ (above 1: overloaded)."""
    growth_per_step: float
    """λ - μ: how much the backlog changes per step while it is not empty."""
    clears_at: float | None
    """When the fluid backlog reaches zero (None if it never does)."""
    steps: tuple[ModelStep, ...]
    mm1: MM1 | None
    """M/M/1 estimates, when λ < μ."""
    warnings: tuple[str, ...]
    """What the numbers rest on, in plain words."""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _tidy(x: float) -> float:
    """Round away float noise (0.30000000000000004 → 0.3) without hiding real digits."""
    return round(x, 9) + 0.0  # + 0.0 turns -0.0 into 0.0


def run_model(
    arrival: float, service: float, backlog: float, steps: int | None = None
) -> ModelResult:
    """Step the fluid model and compute M/M/1 estimates if λ < μ.

    ``steps=None`` picks enough steps to show the backlog clear (plus two), or
    ``MAX_AUTO_STEPS`` when it never clears. Raises ValueError for λ < 0,
    μ <= 0, a negative backlog or ``steps < 1``.
    """
    if not arrival >= 0 or math.isinf(arrival):
        raise ValueError(f"arrival rate must be a finite number >= 0, got {arrival!r}")
    if not service > 0 or math.isinf(service):
        raise ValueError(f"service rate must be a finite number > 0, got {service!r}")
    if not backlog >= 0 or math.isinf(backlog):
        raise ValueError(f"backlog must be a finite number >= 0, got {backlog!r}")
    if steps is not None and steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps!r}")

    growth = arrival - service
    clears_at: float | None
    if backlog == 0:
        clears_at = 0.0 if growth <= 0 else None
    else:
        clears_at = _tidy(backlog / -growth) if growth < 0 else None
    if steps is None:
        steps = MAX_AUTO_STEPS if clears_at is None else min(math.ceil(clears_at) + 2, 1000)
        steps = max(steps, 4)

    rows = [ModelStep(0, _tidy(backlog), 0.0, 0.0)]
    level = backlog
    for t in range(1, steps + 1):
        served = min(service, level + arrival)
        level = _tidy(level + arrival - served)
        rows.append(ModelStep(t, level, _tidy(served), _tidy(served / service)))

    mm1: MM1 | None = None
    if arrival < service:
        rho = arrival / service
        mm1 = MM1(
            rho=_tidy(rho),
            mean_in_system=_tidy(rho / (1 - rho)),
            mean_time_in_system=_tidy(1 / (service - arrival)),
            mean_waiting=_tidy(rho * rho / (1 - rho)),
            mean_wait=_tidy(rho / (service - arrival)),
        )
    return ModelResult(
        arrival=arrival,
        service=service,
        backlog=backlog,
        utilisation=_tidy(arrival / service),
        growth_per_step=_tidy(growth),
        clears_at=clears_at,
        steps=tuple(rows),
        mm1=mm1,
        warnings=(POISSON_WARNING, KEYS_NOTE) if mm1 is not None else (KEYS_NOTE,),
    )


def _num(x: float) -> str:
    return f"{x:g}"


def prediction(result: ModelResult, t0: int = 0) -> str:
    """The fluid model's prediction in words, for a run that is at ``result.backlog`` at ``t0``.

    λ > μ: ``"backlog 4+t"`` (growth 1 from 4 at t=0), ``"backlog 7+2(t-3)"``
    (from 7 at t=3); λ < μ: ``"clears at t=4"``; λ = μ: ``"backlog stays at 4"``.
    Raises ValueError for ``t0 < 0``.
    """
    if t0 < 0:
        raise ValueError(f"t0 must be >= 0, got {t0!r}")
    growth, b = result.growth_per_step, _num(result.backlog)
    if growth > 0:
        slope = "" if growth == 1 else _num(growth)
        return f"backlog {b}+{slope}t" if t0 == 0 else f"backlog {b}+{slope}(t-{t0})"
    if result.clears_at is None or result.backlog == 0:
        return f"backlog stays at {b}"
    return f"clears at t={_num(_tidy(t0 + result.clears_at))}"
