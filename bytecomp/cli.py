"""The ``bytecomp`` command line: every command is a thin layer over the library.

Errors a user can cause end as one line on stderr and exit code 2. Results go to stdout
(``--format json``: one JSON document), notes and warnings to stderr.

Over 500 lines: one typer app, its six commands, each beside what it prints (tables on
the shared consoles, or its JSON document), and the one exit path (one line, exit code
2) they all go through; split, a command would sit in one module and its output in
another.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import json
import math
import sys
import typing
from dataclasses import replace
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from bytecomp.buckets import cap_label
from bytecomp.errors import BytecompError
from bytecomp.options import BenchOptions, PlanOptions, ProfileOptions, SimulateOptions
from bytecomp.ui import announce, warn

app = typer.Typer(
    help="Gradient-compression strategy optimizer for PyTorch DDP: profile, plan, apply.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # click's plain help: rich's help panels cut long option names ("--fidelity-iterati…")
    # at 80 columns or piped; click's never cuts a name and wraps the help beside it
    rich_markup_mode=None,
)
console = Console()
errors = Console(stderr=True)
FORMATS = ("table", "json")
FORMAT_HELP = ("table (for people) or json (one JSON document on stdout, for programs; "
               "notes, warnings and progress on stderr).")


def _check_format(value: str) -> bool:
    """Whether the output is JSON (``--format json``); one line for anything but the
    two formats."""
    if value not in FORMATS:
        raise BytecompError(f"--format must be table or json, got {value!r}")
    return value == "json"


def _plain(value):
    """``value`` as JSON holds it: NaN and infinities as null, tuples and paths as lists
    and strings, numpy scalars as numbers."""
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    if isinstance(value, Path):
        return str(value)
    if hasattr(value, "item"):  # a numpy or torch scalar
        return _plain(value.item())
    return str(value)


def _emit_json(document: dict) -> None:
    """``document`` on stdout: one JSON document, ``json.loads`` parses it."""
    sys.stdout.write(json.dumps(_plain(document), indent=2, allow_nan=False) + "\n")
    sys.stdout.flush()


def _show(table: Table, keep: tuple[int, ...] = (0,), stream: Console | None = None) -> None:
    """Print ``table`` with the words of its ``keep`` columns (names) whole at any width
    the words fit (:class:`bytecomp.ui.Fitted`)."""
    from bytecomp.ui import Fitted

    (stream or console).print(Fitted(table, keep))


def _notes(notes: list[str]) -> None:
    """Notes on stderr, one line each (results stay alone on stdout)."""
    for note in notes:
        errors.print(f"note: {escape(note)}", highlight=False, soft_wrap=True)


def _version(value: bool) -> None:
    if value:
        from bytecomp import __version__

        console.print(f"bytecomp {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the version and exit.")) -> None:
    """Gradient-compression strategy optimizer for PyTorch DDP: profile, plan, apply."""
    from bytecomp.files import remove_stale_scratch

    remove_stale_scratch()  # what a run killed outright left in the scratch root


@app.command()
def compressors(
    specs: list[str] = typer.Argument(None, help="Specs to show (default: every compressor)."),
    numel: int = typer.Option(1 << 20, min=1, help="Elements used for the payload column."),
    output_format: str = typer.Option("table", "--format", help=FORMAT_HELP),
):
    """List the compressors: parameters, capabilities and payload size."""
    from bytecomp.comm.schemes import SCHEMES, supported_schemes
    from bytecomp.compress import COMPRESSORS, from_spec, kernels
    from bytecomp.schema import MAX_INTEGER

    as_json = _check_format(output_format)
    if not 1 <= numel <= MAX_INTEGER:  # the most elements a profiled tensor may have
        raise BytecompError(f"--numel must be from 1 to {MAX_INTEGER:,} elements, got {numel:,}")
    chosen = [from_spec(spec) for spec in specs] if specs else \
        [from_spec(name) for name in COMPRESSORS]
    if as_json:
        _emit_json({"numel": numel, "element_size": 4,
                    "schemes": {scheme.name: scheme.label for scheme in SCHEMES.values()},
                    "compressors": [_compressor_json(c, numel) for c in chosen]})
        return
    missing = "" if kernels.triton_installed() else " (triton is not installed)"
    table = Table(title=f"bytecomp compressors: payload for {numel:,} float32 elements",
                  caption="schemes: " + ", ".join(f"{s.label} {s.name}"
                                                  for s in SCHEMES.values())
                  + f"; kernel: what encodes a CUDA tensor here, triton (fused kernels) or "
                    f"torch (PyTorch ops, as on the CPU){missing}")
    for column in ("name", "parameters", "EF", "sum", "kernel", "schemes", "payload bytes",
                   "ratio"):
        table.add_column(column, overflow="fold",
                         justify="right" if column in ("payload bytes", "ratio") else "left")
    dense = numel * 4
    for compressor in chosen:
        parameters = ", ".join(f"{key}={_shown(value)}" for key, value in
                               compressor.values.items())
        payload = compressor.payload_bytes(numel, 4)
        note = "" if compressor.fixed_size else f" ({compressor.payload_estimate})"
        table.add_row(compressor.name, parameters, "on" if compressor.error_feedback else "off",
                      "yes" if compressor.summable else "no", kernels.path(compressor),
                      " ".join(SCHEMES[s].label for s in supported_schemes(compressor)),
                      f"{payload:,}{note}", f"{dense / payload:.1f}x")
    _show(table, keep=(0, 1))


def _compressor_json(compressor, numel: int) -> dict:
    """A compressor as ``compressors --format json`` shows it: spec, parameters, the
    traits it declares (:attr:`bytecomp.compress.base.Compressor.TRAITS`), what encodes a
    CUDA tensor here (``cuda_path``: triton or torch), schemes and payload for ``numel``
    float32 elements."""
    from bytecomp.comm.schemes import supported_schemes
    from bytecomp.compress import kernels

    payload = compressor.payload_bytes(numel, 4)
    return {
        "name": compressor.name, "spec": compressor.spec, "summary": compressor.summary,
        "parameters": dict(compressor.values), "error_feedback": compressor.error_feedback,
        "params": {key: {"type": param.kind.__name__, "default": param.default,
                         "accepts": param.describe(), "help": param.help}
                   for key, param in compressor.params.items()},
        "traits": {trait: getattr(compressor, trait) for trait in compressor.TRAITS
                   if trait not in ("name", "summary", "params")},
        "cuda_path": kernels.path(compressor),
        "schemes": supported_schemes(compressor),
        "payload_bytes": payload, "ratio": numel * 4 / payload,
    }


def _command(options_class, *leading: inspect.Parameter, trailing: tuple = ()):
    """A command whose options are ``options_class``'s fields (:mod:`bytecomp.options`:
    their names, defaults and help, declared once for the command and the library), after
    the ``leading`` parameters (arguments, options of the command line alone) and before
    the ``trailing`` ones. The decorated body gets the checked options first."""
    hints = typing.get_type_hints(options_class)
    own = [item for item in dataclasses.fields(options_class) if item.metadata.get("cli", True)]

    def cli_type(kind):
        members = [member for member in typing.get_args(kind) if member is not type(None)]
        if typing.get_origin(kind) is tuple:  # a repeatable option
            return list[members[0]]  # type: ignore[valid-type]
        return members[0] if members else kind

    def parameter(item) -> inspect.Parameter:
        default = None if item.default == () else item.default
        meta = item.metadata
        return inspect.Parameter(item.name, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                 default=typer.Option(default, *meta["names"], help=meta["help"],
                                                      min=meta["min"]),
                                 annotation=cli_type(hints[item.name]))

    def decorate(body):
        names = {item.name for item in own}

        def command(**given):
            values = {name: value for name, value in given.items() if name in names}
            rest = {name: value for name, value in given.items() if name not in names}
            return body(options_class.build(**values), **rest)

        parameters = [*leading, *map(parameter, own), *trailing]
        command.__signature__ = inspect.Signature(parameters)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in parameters}
        command.__name__, command.__doc__ = body.__name__, body.__doc__
        return app.command()(command)

    return decorate


def _argument(name: str, help: str, **settings) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                             default=typer.Argument(..., help=help, **settings), annotation=str)


def _format_option() -> inspect.Parameter:
    return inspect.Parameter("output_format", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                             default=typer.Option("table", "--format", help=FORMAT_HELP),
                             annotation=str)


@_command(ProfileOptions)
def profile(options: ProfileOptions):
    """Measure a real DDP job: compute, ready times, buckets, collectives, compressors,
    and each compressor's gradient fidelity on every tensor."""
    from bytecomp import api

    api.profile(options=options)


@_command(PlanOptions, _argument("profile", "Profile directory (from bytecomp profile)."),
          trailing=(inspect.Parameter("verbose", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                      default=typer.Option(False, "--verbose", "-v",
                                                           help="Show fit quality and "
                                                                "pruning."),
                                      annotation=bool), _format_option()))
def plan(options: PlanOptions, profile: str, verbose: bool, output_format: str):
    """Search the per-tensor strategy that trains soonest: shortest predicted iteration per
    unit of gradient fidelity (or iteration time alone); write plan.yaml."""
    from bytecomp import api

    as_json = _check_format(output_format)
    result = api.plan(profile, options=options, announce=_announce)
    if verbose and result.planner is not None:  # on stdout, or beside JSON on stderr
        _print_fits(result.planner, errors if as_json else console)
    if as_json:
        _notes(result.notes)
        _warn(result.warnings)
        _emit_json(result.to_dict())
    elif result.ladder is not None:
        _print_ladder(result)
    else:
        if result.verification is not None:
            _print_finalists(result.verification)
        _print_plan(result)


def _print_ladder(result) -> None:
    from bytecomp.search.result import effective_ms

    ladder, (level, start) = result.ladder, (result.ladder.levels[0],
                                             result.ladder.adaptive.start)
    table = Table(title=f"adaptive plan: {ladder.adaptive.family} ladder on "
                        f"{level.cluster.name} ({level.cluster.nodes} x "
                        f"{level.cluster.ranks_per_node} ranks), bucket cap {level.cap_mb:g} "
                        f"MB; training starts at level {start} (*) and the executor moves up "
                        f"while the calibrated gain stays >= {ladder.adaptive.threshold:g}; "
                        f"the ranks agree every {ladder.adaptive.agree_every} step(s)")
    for column in ("level", "setting", "iteration ms", "profiled gain", "fidelity",
                   "effective ms", "vs fp32 DDP"):
        table.add_column(column, justify="left" if column == "setting" else "right")
    for row in result.strategies.to_dict(orient="records"):
        fidelity, gain = row["fidelity"], row["gain"]
        table.add_row(f"{row['level']}{'*' if row['level'] == start else ''}", row["setting"],
                      f"{row['iteration_ms']:.2f}", _or_dash(gain, ".3f"),
                      _or_dash(fidelity, ".3f"),
                      "-" if not _known(fidelity) or not fidelity else
                      f"{effective_ms(row['iteration_ms'], fidelity):.2f}",
                      f"{row['vs_fp32']:.2f}x")
    _show(table, keep=(1,))
    _notes(result.notes)
    console.print(f"wrote {result.written}")


def _known(value) -> bool:
    return value is not None and value == value  # a DataFrame holds None as NaN


def _or_dash(value, form: str) -> str:
    return format(value, form) if _known(value) else "-"


def _print_fits(planner, stream: Console) -> None:
    from bytecomp.costs.fitted import fit_quality
    from bytecomp.search.tree import pruned_counts

    table = Table(title="fitted models: collectives and copies a + b * size (alpha-beta); "
                  "compressors monotone piecewise (a: time at the smallest size, b: slope "
                  "of the last segment)")
    for column in ("model", "key", "form", "a ms", "b ms/unit", "R²", "worst rel. error",
                   "points"):
        table.add_column(column, justify="left" if column in ("model", "key") else "right")
    quality = fit_quality(planner.comm.rows() + planner.compute.rows())
    for row in quality.itertuples():
        table.add_row(row.model, row.key, row.form, f"{row.a_ms:.4f}", f"{row.b_ms_per_unit:.3e}",
                      f"{row.r2:.4f}", f"{100 * row.worst_rel_error:.1f}%", str(row.points))
    _show(table, keep=(0, 1), stream=stream)
    for reason, count in pruned_counts(planner.tree).items():
        stream.print(f"pruned {count} options: {reason}")
    stream.print(f"{len(planner.problem.options)} options offered per tensor")


def _print_finalists(verification) -> None:
    trained = f"trained {verification.steps} steps from the same weights on the profiled " \
              f"ranks (losses on {verification.batches})" if verification.steps else \
              "none trained here"
    table = Table(title=f"finalists, {trained}; chosen (*) by predicted ms per step x "
                        f"measured steps factor")
    for column in ("finalist", "bucket cap MB", "predicted ms", "steps factor", "factor from",
                   "ms per fp32 step"):
        table.add_column(column, justify="left" if column in ("finalist", "factor from")
                         else "right")
    for finalist in verification.finalists:
        star = "*" if finalist is verification.choice.finalist else ""
        factor = finalist.steps_factor
        table.add_row(finalist.name + star, cap_label(finalist.cap_mb), f"{finalist.time_ms:.2f}",
                      "-" if factor is None else f"{factor:.2f}",
                      verification.factor_from.get(finalist.name, "-"),
                      f"{finalist.value:.2f}" if math.isfinite(finalist.value) else "inf")
    _show(table)


def _announce(text: str) -> None:
    """A stage's opening line on stderr: what it does, how long, how to skip it."""
    announce(text)


def _print_plan(planned) -> None:
    result = planned.search
    known = result.fidelity is not None
    effective = result.objective.name == "effective"
    title = f"predicted on {result.cluster.name} ({result.cluster.nodes} x " \
            f"{result.cluster.ranks_per_node} ranks); objective: " + \
            (f"effective time, fidelity ({result.objective.weights}-weighted) >= "
             f"{result.objective.min_fidelity:g}" if effective
             else "iteration time")
    table = Table(title=title)
    columns = ["strategy", "bucket cap MB", "iteration ms"]
    columns += ["fidelity", "effective ms"] if known else []
    columns += ["vs fp32 DDP"]
    for column in columns:
        table.add_column(column, justify="left" if column == "strategy" else "right")
    for number, row in enumerate(result.strategy_rows()):
        cells = [row["strategy"], cap_label(row["cap_mb"]), f"{row['time_ms']:.2f}"]
        if known:
            cells += [f"{row['fidelity']:.3f}" + (" (below)" if row["below"] else ""),
                      f"{row['effective_ms']:.2f}"]
        cells.append(f"{row['vs_fp32']:.2f}x")
        if number == 0:  # the plan
            cells = [f"[bold]{cell}[/]" for cell in cells]
        table.add_row(*cells)
    _show(table)
    # one line however narrow the terminal: CI logs grep it
    console.print("plan: " + planned.summary, soft_wrap=True)
    console.print(f"search: {result.algorithm}, {result.search_ms:.0f} ms, "
                  f"{result.evaluations} simulations; lower bound {result.lower_bound_ms:.2f} ms "
                  f"({result.gap_text()})")
    console.print(f"evidence: {result.evidence}")
    _notes(planned.notes)
    _warn(planned.warnings)
    if planned.written is not None:
        console.print(f"wrote {planned.written}")
    if planned.evidence:  # files beside the plan the user did not name: say which
        console.print("wrote the finalists' evidence beside it: "
                      + ", ".join(str(path) for path in planned.evidence), soft_wrap=True)


@_command(SimulateOptions, _argument("profile", "Profile directory."),
          _argument("plan_file", "Plan file (plan.yaml).", metavar="PLAN"),
          trailing=(_format_option(),))
def simulate(options: SimulateOptions, profile: str, plan_file: str, output_format: str):
    """Simulate one iteration of a plan: time breakdown, trace and Gantt chart."""
    from bytecomp import api

    as_json = _check_format(output_format)
    simulation = api.simulate(profile, plan_file, options=options)
    if as_json:
        _emit_json(simulation.to_dict())
        return
    table = Table(title=f"simulated iteration of {plan_file}")
    table.add_column("quantity")
    table.add_column("ms", justify="right")
    for row in simulation.table.itertuples():
        table.add_row(row.quantity, f"{row.ms:.2f}")
    _show(table)
    for path in simulation.written:
        console.print(f"wrote {path}")


@_command(BenchOptions, _argument("profile", "Profile directory the plan was made from."),
          inspect.Parameter("plan_file", inspect.Parameter.POSITIONAL_OR_KEYWORD,
                            default=typer.Option(..., "--plan", help="The plan to measure "
                                                 "(repeatable: the first is 'bytecomp plan', "
                                                 "the others are named by their files)."),
                            annotation=list[str]),
          trailing=(_format_option(),))
def bench(options: BenchOptions, profile: str, plan_file: list[str], output_format: str):
    """Measure the plan and the baselines for real, beside the model's predictions; with
    --train-steps, also their time to a target validation loss."""
    from bytecomp import api

    as_json = _check_format(output_format)
    result = api.bench(profile, plan_file, options=replace(options, tables=not as_json))
    if as_json and result is not None:  # under torchrun: rank 0's, as the table
        _emit_json(result.to_dict())


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def emulate(
    ctx: typer.Context,
    nodes: int = typer.Option(2, help="Emulated nodes (one network namespace each)."),
    ranks_per_node: int = typer.Option(1, help="Ranks per node (they share its namespace)."),
    bandwidth: str = typer.Option("1gbit", help="Link rate of every node, both directions "
                                  "(tc syntax: 100mbit, 1gbit, 10gbit)."),
    latency: str = typer.Option("0", help="Added one-way latency (needs the netem qdisc)."),
    burst: str = typer.Option(None, help="Token-bucket depth of every link (tc syntax: 32kb; "
                              "default: one millisecond at the rate, at least 16kb). A deep "
                              "bucket lets small messages after a pause go for free."),
    check: bool = typer.Option(False, "--check", help="Measure a 2-node allreduce of 16 MiB "
                               "and compare the achieved bandwidth with the configured one."),
):
    """Run COMMAND's ranks in network namespaces over shaped links, like torchrun:
    bytecomp emulate --nodes 2 --ranks-per-node 2 --bandwidth 1gbit -- python train.py"""
    from bytecomp.emulate import check_bandwidth, run_emulated

    if check:
        result = check_bandwidth(bandwidth, burst=burst)
        table = Table(title="emulated 2-node allreduce of 16 MiB (gloo)")
        for column in ("configured Gbit/s", "achieved Gbit/s (bus)", "achieved share",
                       "time ms"):
            table.add_column(column, justify="right")
        table.add_row(f"{result['configured_gbps']:.3f}", f"{result['achieved_gbps']:.3f}",
                      f"{100 * result['share']:.1f}%", f"{result['time_ms']:.1f}")
        console.print(table)
        return
    code = run_emulated(list(ctx.args), nodes, ranks_per_node, bandwidth, latency, burst=burst)
    raise typer.Exit(code)


def _shown(value) -> str:
    from bytecomp.compress.base import format_value

    return format_value(value)


def _warn(warnings: list[str]) -> None:
    """Warnings on stderr, one line each."""
    for warning in warnings:
        warn(warning)


def _error(message: str, code: int) -> None:
    errors.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)
    sys.exit(code)


@contextlib.contextmanager
def _stop_signals_interrupt():
    """SIGTERM and SIGHUP (a closed terminal) stop a command as Ctrl-C does: its ranks are
    stopped, its temporaries removed, and it says so; not a silent death mid-stage."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(_signum, _frame):
        raise KeyboardInterrupt

    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGHUP)}
    for sig, handler in previous.items():
        if handler is signal.SIG_DFL:  # not where a caller set its own
            signal.signal(sig, interrupt)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the console script: user errors become one line and exit 2.

    Typer runs outside its standalone mode so that a bad option value, a missing
    argument or an unknown option is one line too, not a boxed usage screen.
    ``argv`` (default: ``sys.argv[1:]``) lets tests run a command in-process; the
    program is then named ``bytecomp``, as the console script names it.
    """
    from typer._click.exceptions import ClickException, NoArgsIsHelpError, UsageError

    try:
        with _stop_signals_interrupt():
            code = app(args=argv, prog_name=None if argv is None else "bytecomp",
                       standalone_mode=False)
    except BytecompError as error:
        _error(str(error), getattr(error, "exit_code", 2))
    except NoArgsIsHelpError as error:
        typer.echo(error.ctx.get_help())  # click's plain help, as --help prints it
        sys.exit(2)
    except UsageError as error:
        hint = f" (see {error.ctx.command_path} --help)" if error.ctx else ""
        _error(error.format_message() + hint, error.exit_code)
    except ClickException as error:
        _error(error.format_message(), error.exit_code)
    except (KeyboardInterrupt, typer.Abort):
        code = 130
    if code == 130:
        errors.print("[bold red]interrupted[/]")
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
