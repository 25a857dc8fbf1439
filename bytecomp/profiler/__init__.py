"""``bytecomp profile``'s measurements: a real DDP job on real ranks (the command's
orchestration is :mod:`bytecomp.commands.profile`).

>>> from bytecomp.commands.profile import run_profile
>>> from bytecomp.profiler import ProfileConfig, load_profile
>>> run_profile(ProfileConfig(model="cnn", out="profiles/cnn"), nproc=2)
>>> profile = load_profile("profiles/cnn")
"""

from __future__ import annotations

from bytecomp.profile_store import Profile, load_profile, save_profile
from bytecomp.profiler.runner import ProfileConfig
from bytecomp.training.builtin_models import BUILTINS

__all__ = ["BUILTINS", "Profile", "ProfileConfig", "load_profile", "save_profile"]
