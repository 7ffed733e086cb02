"""``keyqueue lab model``: the click command (options, then ``run_model``, then its render)."""

from __future__ import annotations

import click

from ..._console.format import Mode, Output
from ..._console.options import float_option, int_option, output_options
from . import render
from .run import run_model

__all__ = ["model"]


@click.command(short_help="Backlog, utilisation and M/M/1 estimates for λ and μ.")
@float_option(
    "--arrival",
    "--lambda",
    "arrival",
    min=0,
    max=1e12,
    default=4.0,
    help="λ: keys becoming ready per step (per second, say).",
)
@float_option(
    "--service",
    "--mu",
    "service",
    above=0,
    max=1e12,
    default=3.0,
    help="μ: keys all the workers together can finish per step.",
)
@float_option(
    "--backlog",
    min=0,
    max=1e12,
    default=4.0,
    help="Keys waiting at t=0.",
)
@int_option(
    "--steps",
    min=1,
    max=1000,
    default=None,
    help="Steps to show [default: until the backlog clears, plus two; else 12].",
)
@output_options
def model(
    *, arrival: float, service: float, backlog: float, steps: int | None, as_json: bool, plain: bool
) -> None:
    """The fluid view of capacity: backlog per step, utilisation, M/M/1.

    With λ keys arriving and μ served per step the backlog changes by λ-μ per
    step: λ=4, μ=3 from a backlog of 4 grows as 4+t; λ=2, μ=3 clears it at t=4.
    When λ < μ it adds M/M/1 estimates (mean keys in the system, mean time in
    it), which rest on Poisson assumptions.
    """
    out = Output(Mode.choose(as_json, plain))
    result = run_model(arrival, service, backlog, steps)
    out.show(result, render.render_model)
