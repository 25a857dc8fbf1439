"""The ``bytecomp`` command line: every command is a thin layer over the library.

Errors a user can cause end as one line on stderr and exit code 2.
"""

from __future__ import annotations

import sys

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from bytecomp.errors import BytecompError

app = typer.Typer(
    help="Gradient-compression strategy optimizer for PyTorch DDP: profile, plan, apply.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
errors = Console(stderr=True)


def _version(value: bool) -> None:
    if value:
        from bytecomp import __version__

        console.print(f"bytecomp {__version__}")
        raise typer.Exit()


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the version and exit.")) -> None:
    """Gradient-compression strategy optimizer for PyTorch DDP: profile, plan, apply."""


SCHEME_ABBREVIATIONS = {"allreduce": "AR", "allgather": "AG", "twoshot": "2S",
                        "hierarchical": "H"}


@app.command()
def compressors(
    specs: list[str] = typer.Argument(None, help="Specs to show (default: every compressor)."),
    numel: int = typer.Option(1 << 20, help="Elements used for the payload column."),
):
    """List the compressors: parameters, capabilities and payload size."""
    from bytecomp.comm.schemes import supported_schemes
    from bytecomp.compress import COMPRESSORS, from_spec

    chosen = [from_spec(spec) for spec in specs] if specs else \
        [from_spec(name) for name in COMPRESSORS]
    table = Table(title=f"bytecomp compressors: payload for {numel:,} float32 elements",
                  caption="schemes: AR allreduce, AG allgather, 2S two-shot alltoall+allgather, "
                          "H hierarchical")
    for column in ("name", "parameters", "EF", "sum", "schemes", "payload bytes", "ratio"):
        table.add_column(column, overflow="fold",
                         justify="right" if column in ("payload bytes", "ratio") else "left")
    dense = numel * 4
    for compressor in chosen:
        parameters = ", ".join(f"{key}={_shown(value)}" for key, value in
                               compressor.values.items())
        payload = compressor.payload_bytes(numel, 4)
        note = "" if compressor.fixed_size else " (bound)"
        if compressor.name == "exdyna":
            note = " (target)"
        table.add_row(compressor.name, parameters, "on" if compressor.error_feedback else "off",
                      "yes" if compressor.summable else "no",
                      " ".join(SCHEME_ABBREVIATIONS[s] for s in supported_schemes(compressor)),
                      f"{payload:,}{note}", f"{dense / payload:.1f}x")
    console.print(table)


@app.command()
def profile(
    model: str = typer.Option("mlp", help="Built-in workload (mlp, cnn, transformer[:layers=4,"
                              "width=256,seq_len=128], lstm, resnet18, resnet50, vgg16) or "
                              "pkg.module:factory."),
    nproc: int = typer.Option(None, help="Local ranks to spawn (default 1; leave out under "
                              "torchrun, which sets the ranks)."),
    out: str = typer.Option(None, help="Profile directory (default profiles/<model>)."),
    batch_size: int = typer.Option(None, help="Batch per rank (default: the workload's)."),
    bucket_cap_mb: float = typer.Option(25.0, help="DDP bucket cap used while profiling."),
    iterations: int = typer.Option(20, min=1, help="Timed iterations per phase."),
    warmup: int = typer.Option(3, min=0, help="Untimed iterations before each phase."),
    compressor: list[str] = typer.Option(None, help="Compressor spec to sweep (repeatable; "
                                         "default: every compressor at its defaults)."),
    quick: bool = typer.Option(False, help="A reduced sweep (seconds, not minutes)."),
    force: bool = typer.Option(False, help="Replace an existing profile directory."),
    device: str = typer.Option("auto", help="auto, cpu or cuda."),
    timeout: float = typer.Option(300.0, help="Seconds before a stuck collective fails."),
    max_mb: float = typer.Option(64.0, help="Largest collective buffer in the sweeps (MiB)."),
    machine: str = typer.Option("", help="A description of the machine, kept in profile.yaml."),
):
    """Measure a real DDP job: compute, ready times, buckets, collectives, compressors."""
    from bytecomp.profile import ProfileConfig, run_profile
    from bytecomp.profile.workloads import safe_name

    if nproc is not None and nproc < 1:
        raise BytecompError(f"--nproc must be at least 1, got {nproc}")
    if device not in ("auto", "cpu", "cuda"):
        raise BytecompError(f"--device must be auto, cpu or cuda, got {device!r}")
    config = ProfileConfig(model=model, out=out or f"profiles/{safe_name(model)}",
                           batch_size=batch_size, bucket_cap_mb=bucket_cap_mb,
                           iterations=iterations, warmup=warmup, specs=compressor or [],
                           quick=quick, force=force, device=device, timeout_s=timeout,
                           max_mb=max_mb, machine=machine)
    run_profile(config, nproc)


def _shown(value) -> str:
    from bytecomp.compress.base import format_value

    return format_value(value)


def main() -> None:
    """Entry point of the console script: user errors become one line and exit 2."""
    try:
        app()
    except BytecompError as error:
        errors.print(f"[bold red]error:[/] {escape(str(error))}", highlight=False, soft_wrap=True)
        sys.exit(getattr(error, "exit_code", 2))
    except KeyboardInterrupt:
        errors.print("[bold red]interrupted[/]")
        sys.exit(130)


if __name__ == "__main__":
    main()
