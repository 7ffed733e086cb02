"""How ``keyqueue lab model`` looks: the fluid model's table, what it means, and M/M/1."""

from __future__ import annotations

from rich.text import Text

from ..._console.format import RHO, Output, count, number, numbered
from .run import ModelResult

__all__ = ["render_model"]


def _num(x: float) -> str:
    return number(x)


def _per_step(x: float) -> str:
    """'1 key/step', '2.5 keys/step'."""
    return f"{numbered(x, 'key')}/step"


def _steps(x: float) -> str:
    return f"{number(x, 3)} step" if x == 1 else f"{number(x, 3)} steps"


def _percent(fraction: float) -> str:
    return f"{count(100 * fraction)}%"


def render_model(result: ModelResult, out: Output) -> None:
    b = _num(result.backlog)
    title = (
        f"Fluid model: λ={_per_step(result.arrival)} arrive, μ={_per_step(result.service)} "
        f"served, backlog {b} at t=0"
    )
    table = out.table("t", "backlog", "served", "utilisation", title=title)
    for step in result.steps:
        table.add_row(
            count(step.t),
            _num(step.backlog),
            "" if step.t == 0 else _num(step.served),
            "" if step.t == 0 else _percent(step.utilisation),
        )
    out.print(table)
    util = _percent(result.utilisation)
    growth = result.growth_per_step
    if growth > 0:
        out.print(
            Text(
                f"Overloaded: λ/μ = {util}. The backlog grows by λ-μ = {_num(growth)} per "
                f"step (backlog(t) = {b} + {_num(growth)}·t) and never clears.",
                "bold red",
            )
        )
    elif result.clears_at is not None:
        how = f"backlog / (μ-λ) = {b} / {_num(-growth)}" if growth < 0 else "nothing to clear"
        out.print(
            Text(f"λ/μ = {util}. The backlog clears at t = {_num(result.clears_at)} ({how}).")
        )
    else:
        out.print(Text(f"λ = μ: λ/μ = {util}. The backlog stays at {b}: it never clears."))
    if result.mm1 is not None:
        m = result.mm1
        out.print(
            Text(
                f"M/M/1 with {RHO} = λ/μ = {number(m.rho, 3)}: on average L = {RHO}/(1-{RHO}) = "
                f"{numbered(m.mean_in_system, 'key', digits=3)} in the system "
                f"(Lq = {number(m.mean_waiting, 3)} waiting), "
                f"and each spends W = 1/(μ-λ) = {_steps(m.mean_time_in_system)} from ready "
                f"to done (Wq = {_steps(m.mean_wait)} waiting)."
            )
        )
    else:
        out.print(Text("No M/M/1 estimates: they need λ < μ (otherwise there is no steady state)."))
    for warning in result.warnings:
        out.print(Text(warning, "yellow"))
