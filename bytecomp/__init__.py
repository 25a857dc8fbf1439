"""bytecomp: per-tensor gradient-compression strategies for PyTorch DDP.

Profile a job (``bytecomp profile``, or :func:`bytecomp.profile`), plan
(``bytecomp plan``, :func:`bytecomp.plan`), and apply the plan in the training
script::

    ddp = DistributedDataParallel(model, bucket_cap_mb=plan.bucket_cap_mb)
    executor = bytecomp.apply_plan(ddp, "plan.yaml")
"""

__version__ = "0.1.0"

__all__ = ["apply_plan", "comm_hook", "autotune", "load_plan", "Plan", "Recipe", "BytecompError", "PeerFailure",
           "profile", "plan", "simulate", "bench", "load_profile", "Profile", "PlanResult",
           "Simulation", "BenchResult", "ProfileOptions", "PlanOptions", "SimulateOptions",
           "BenchOptions", "__version__"]
# The pipeline's names (bytecomp.api, bytecomp.commands, bytecomp.options), by the module
# that owns them.
_PIPELINE = {"profile": "api", "plan": "api", "simulate": "api", "bench": "api",
             "Simulation": "commands.simulate", "BenchResult": "commands.bench",
             "PlanResult": "commands.plan",
             "load_profile": "profile_store", "Profile": "profile_store",
             "ProfileOptions": "options", "PlanOptions": "options",
             "SimulateOptions": "options", "BenchOptions": "options"}


def __getattr__(name):
    # Imported on first use, so that `bytecomp --help` does not pay for torch.
    if name == "apply_plan":
        from bytecomp import runtime

        return runtime.apply_plan
    if name == "comm_hook":  # a plan, or autotune=
        from bytecomp.autotuner.comm_hook import comm_hook

        return comm_hook
    if name == "autotune":
        from bytecomp.autotuner import autotune

        return autotune
    if name == "load_plan":
        from bytecomp.plan_file import load_plan

        return load_plan
    if name == "Plan":
        from bytecomp.plan_types import Plan

        return Plan
    if name == "BytecompError":
        from bytecomp.errors import BytecompError

        return BytecompError
    if name == "PeerFailure":
        from bytecomp.runtime.peers import PeerFailure

        return PeerFailure
    if name == "Recipe":
        from bytecomp.recipe import Recipe

        return Recipe
    if name in _PIPELINE:
        import importlib

        return getattr(importlib.import_module(f"bytecomp.{_PIPELINE[name]}"), name)
    raise AttributeError(f"module 'bytecomp' has no attribute {name!r}")
