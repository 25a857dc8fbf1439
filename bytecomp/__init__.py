"""bytecomp: per-tensor gradient-compression strategies for PyTorch DDP.

Profile a job (``bytecomp profile``), plan (``bytecomp plan``), and apply the
plan in the training script::

    executor = bytecomp.apply_plan(ddp_model, "plan.yaml")
"""

__version__ = "0.1.0"
