"""No code from files: checkpoints load with weights_only=True, and bytecomp/ itself has no
pickle, eval, exec, shell=True or unsafe YAML or torch loading."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest
import torch

from bytecomp.errors import BytecompError

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

from train import load_checkpoint  # noqa: E402


class _Payload:
    """What a crafted checkpoint carries: unpickling it calls ``Path.touch``."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_a_crafted_checkpoint_runs_no_code_on_resume(tmp_path):
    marker = tmp_path / "pwned"
    checkpoint = tmp_path / "ckpt.pt"
    torch.save({"step": 1, "model": {}, "optimizer": {}, "bytecomp": _Payload(marker)},
               checkpoint)
    with pytest.raises(BytecompError, match=r"cannot load checkpoint .*\(weights only\)"):
        load_checkpoint(str(checkpoint), torch.device("cpu"))
    assert not marker.exists()


def test_a_plain_checkpoint_still_loads(tmp_path):
    checkpoint = tmp_path / "ckpt.pt"
    torch.save({"step": 3, "model": {"w": torch.ones(2)}, "optimizer": {"state": {}},
                "bytecomp": {"ranks": [{"a|b": {"shapes": [(2, 3)], "salt": 7}}]}}, checkpoint)
    assert load_checkpoint(str(checkpoint), torch.device("cpu"))["step"] == 3


FORBIDDEN_MODULES = {"pickle", "cPickle", "dill", "marshal", "shelve", "cloudpickle"}
FORBIDDEN_CALLS = {"eval", "exec", "compile", "__import__"}


def _problems(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), str(path))
    found = []
    for node in ast.walk(tree):
        where = f"{path.name}:{getattr(node, 'lineno', 0)}"
        if isinstance(node, ast.Import):
            found += [f"{where}: import {a.name}" for a in node.names
                      if a.name.split(".")[0] in FORBIDDEN_MODULES]
        elif isinstance(node, ast.ImportFrom) and \
                (node.module or "").split(".")[0] in FORBIDDEN_MODULES:
            found.append(f"{where}: from {node.module} import")
        elif isinstance(node, ast.Call):
            found += _call_problems(node, where)
    return found


def _call_problems(node: ast.Call, where: str) -> list[str]:
    name = node.func.id if isinstance(node.func, ast.Name) else \
        node.func.attr if isinstance(node.func, ast.Attribute) else ""
    keywords = {k.arg: k.value for k in node.keywords}
    found = []
    if isinstance(node.func, ast.Name) and name in FORBIDDEN_CALLS:
        found.append(f"{where}: {name}()")
    shell = keywords.get("shell")
    if isinstance(shell, ast.Constant) and shell.value is True:
        found.append(f"{where}: shell=True")
    owner = node.func.value.id if isinstance(node.func, ast.Attribute) and \
        isinstance(node.func.value, ast.Name) else ""
    if (owner, name) in (("os", "system"), ("os", "popen"), ("subprocess", "getoutput")):
        found.append(f"{where}: {owner}.{name}()")
    if name == "load" and isinstance(node.func, ast.Attribute):
        weights_only = keywords.get("weights_only")
        if owner == "torch" and not (isinstance(weights_only, ast.Constant)
                                     and weights_only.value is True):
            found.append(f"{where}: torch.load without weights_only=True")
        loader = keywords.get("Loader")
        if owner == "yaml" and not (isinstance(loader, ast.Name)
                                    and loader.id in ("_StrictLoader", "SafeLoader")):
            found.append(f"{where}: yaml.load without a safe loader")
    if name in ("unsafe_load", "full_load", "load_all") and isinstance(node.func, ast.Attribute):
        found.append(f"{where}: yaml.{name}()")
    return found


def test_bytecomp_has_no_pickle_eval_exec_or_shell():
    problems = [problem for path in sorted((ROOT / "bytecomp").rglob("*.py"))
                for problem in _problems(path)]
    problems += _problems(ROOT / "examples" / "train.py")
    assert problems == []


def test_the_scanner_finds_what_it_looks_for(tmp_path):
    bad = tmp_path / "probe.py"
    bad.write_text("import pickle\nimport os, subprocess, yaml, torch, platform\neval('1')\n"
                   "subprocess.run('ls', shell=True)\nyaml.load('a')\ntorch.load('x')\n"
                   "os.system('ls')\nplatform.system()\n")
    assert len(_problems(bad)) == 6
