"""Which model a profile file may make bytecomp build.

A profile directory is data: people copy it from a colleague or an artifact store.
Its ``model.spec`` names what was profiled, and ``plan`` (training the finalists) and
``bench`` build that model again. A built-in workload is bytecomp's own code, so it is
built as named. A ``pkg.module:factory`` is somebody's code: importing the module runs
it. bytecomp imports it only when the user names the same spec on the command line
(``--model pkg.module:factory``), as ``bytecomp profile --model`` did; a spec that only
the file names is refused in one line, before anything is imported.

This module imports nothing heavy, so the refusal comes before torch loads.
"""

from __future__ import annotations

from bytecomp.errors import BytecompError

# The built-in workloads (bytecomp.profiler.workloads.BUILTINS, which checks it holds these).
BUILTIN_MODELS = ("mlp", "cnn", "transformer", "lstm", "digits", "bow", "resnet18", "resnet50", "vgg16")


def builtin_name(spec: str) -> str | None:
    """The built-in workload ``spec`` names (``transformer:layers=2`` -> ``transformer``),
    or None for a factory or anything else."""
    name = spec.strip().partition(":")[0].strip()
    return name if name in BUILTIN_MODELS else None


def allowed_model(spec: object, given: str | None, source: str, skip: str) -> str:
    """The model spec ``source`` (a profile file) names, if bytecomp may build it: a
    built-in, or the same spec the user gave (``given``, from ``--model``). Otherwise one
    line that says how to allow it, or ``skip`` (how to do without the model).

    ``given`` naming a different model than the file is refused too: the profile's
    measurements belong to its own model.
    """
    if not isinstance(spec, str) or not spec.strip():
        raise BytecompError(f"{source}: model.spec must be the profiled model's spec, got "
                            f"{spec!r}")
    spec = spec.strip()
    if given is not None:
        if given.strip() != spec:
            raise BytecompError(f"--model {given.strip()} is not the model {source} was made "
                                f"from ({spec}): give --model {spec}, or profile "
                                f"{given.strip()}")
        return spec
    if builtin_name(spec) is not None:
        return spec
    shown = spec if spec.isprintable() and len(spec) <= 200 else repr(spec[:200])
    raise BytecompError(f"{source} names the model {shown}, which is code bytecomp does not "
                        f"run because a file names it: pass --model {shown} to run it, or "
                        f"{skip}")
