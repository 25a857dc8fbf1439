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

import os
import re
import sys

from bytecomp.errors import BytecompError

# The built-in workloads (bytecomp.training.builtin_models.BUILTINS, which checks it holds these).
BUILTIN_MODELS = ("mlp", "cnn", "transformer", "lstm", "digits", "bow", "resnet18", "resnet50", "vgg16")


def builtin_name(spec: str) -> str | None:
    """The built-in workload ``spec`` names (``transformer:layers=2`` -> ``transformer``),
    or None for a factory or anything else."""
    name = spec.strip().partition(":")[0].strip()
    return name if name in BUILTIN_MODELS else None


FACTORY_SPEC = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")  # pkg.module:factory


def search_current_directory() -> None:
    """Put the current directory on the module path, after what is there, where it is not
    on it: factory modules are found there by the ``bytecomp`` command as by ``python -m
    bytecomp`` (which puts it first) or a script beside them. After, not first: a file
    of the current directory never shadows an installed package."""
    here = os.getcwd()
    if not any(os.path.abspath(entry or ".") == here for entry in sys.path):
        sys.path.append(here)


def factory_module_found(module: str) -> bool:
    """Whether ``module`` (``pkg.module``) is on the module path or in the current
    directory, found without importing anything (no package's ``__init__`` runs)."""
    from importlib.machinery import PathFinder

    search_current_directory()
    parts = module.split(".")
    locations: list[str] | None = None
    for depth in range(1, len(parts) + 1):
        if depth == 1 and parts[0] in sys.modules:  # a package loaded already
            found_path = getattr(sys.modules[parts[0]], "__path__", None)
            if found_path is None:
                return len(parts) == 1
            locations = list(found_path)
            continue
        found = PathFinder.find_spec(".".join(parts[:depth]), locations)
        if found is None:
            return False
        locations = list(found.submodule_search_locations or [])
        if depth < len(parts) and not locations:
            return False
    return True


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
    if not FACTORY_SPEC.fullmatch(spec):
        raise BytecompError(f"{source} names the model {shown}, which is neither a built-in "
                            f"nor a pkg.module:factory bytecomp can build: {skip}")
    module = spec.partition(":")[0]
    if not factory_module_found(module):
        raise BytecompError(f"{source} names the model {shown}, whose module {module} is not "
                            f"importable here (not in the current directory nor on "
                            f"PYTHONPATH): {skip}, or run from where {module} is importable "
                            f"and pass --model {shown}")
    raise BytecompError(f"{source} names the model {shown}, which is code bytecomp does not "
                        f"run because a file names it: pass --model {shown} to run it, or "
                        f"{skip}")
