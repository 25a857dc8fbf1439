"""The code's shape, for whoever carries it on: behaviour declared on the objects that own
it (no module decides by a compressor's or a scheme's name), the scheme registries in
step, small classes in the runtime, and stages that do not import each other both ways."""

from __future__ import annotations

import ast
import typing
from pathlib import Path

import networkx as nx
import yaml

import bytecomp
from bytecomp.comm.schemes import SCHEMES
from bytecomp.compress import COMPRESSORS
from bytecomp.costs.scheme_costs import SchemeCost, scheme_cost
from bytecomp.profile_meta import REQUIRED_FIELDS, CalibrationMeta, ModelMeta, ProfileMeta

PACKAGE = Path(bytecomp.__file__).resolve().parent
MAX_RUNTIME_CLASS_LINES = 300


def _strings(node: ast.AST) -> set[str]:
    """The string constants of a constant or of a tuple, list or set of them."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return {s for element in node.elts for s in _strings(element)}
    return set()


def _is_spec(node: ast.AST) -> bool:
    """A compressor's name or spec: ``x.name``, ``x.spec`` or a variable called ``spec``."""
    return any((isinstance(n, ast.Attribute) and n.attr in ("name", "spec")) or
               (isinstance(n, ast.Name) and "spec" in n.id) for n in ast.walk(node))


def _is_scheme(node: ast.AST) -> bool:
    """A scheme: anything called ``scheme``, or an attribute ``collective`` (as plan
    entries called it; a variable ``collective`` is a round's primitive)."""
    return any((isinstance(n, ast.Attribute) and (n.attr == "collective" or
                                                   "scheme" in n.attr)) or
               (isinstance(n, ast.Name) and "scheme" in n.id) for n in ast.walk(node))


def name_decisions(source: str, where: str, compressors: set[str],
                   schemes: set[str]) -> list[str]:
    """Places in ``source`` that decide by a name: a comparison (``==``, ``!=``, ``in``,
    ``not in``) of a compressor's name or spec with one of ``compressors``, or of a
    scheme with one of ``schemes``; and a dict literal keyed by such names only."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            for index, operand in enumerate(operands):
                names = _strings(operand)
                others = [o for i, o in enumerate(operands) if i != index]
                if (names & compressors and any(map(_is_spec, others))) or \
                        (names & schemes and any(map(_is_scheme, others))):
                    found.append(f"{where}:{node.lineno}: {ast.unparse(node)}")
        elif isinstance(node, ast.Dict) and len(node.keys) > 1:
            keys = [_strings(key) if key is not None else set() for key in node.keys]
            for vocabulary in (compressors, schemes):
                if all(len(k) == 1 and k <= vocabulary for k in keys):
                    found.append(f"{where}:{node.lineno}: a dict keyed by names "
                                 f"({ast.unparse(node)[:60]})")
    return found


def test_no_module_decides_by_a_compressors_or_a_schemes_name():
    """Traits are declared on compressors and schemes (bytecomp.compress registers a
    compressor and knows its names; bytecomp.testing's synthetic tables describe the
    built-in compressors' typical speeds, with a default for any other)."""
    compressors, schemes = set(COMPRESSORS), set(SCHEMES)
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE.parent)
        if relative.parts[1] in ("compress", "testing"):
            continue
        found += name_decisions(path.read_text(), str(relative), compressors, schemes)
    assert not found, "\n".join(found)


def test_the_scan_finds_what_it_looks_for():
    """The scan flags the forms that the code once had (so it can fail)."""
    compressors, schemes = set(COMPRESSORS), set(SCHEMES)
    decisions = [
        'if compressor.name == "powersgd": pass',
        'ok = from_spec(spec).name in ("fp16", "bf16")',
        'if option.collective == "hierarchical": pass',
        'if scheme in ("allreduce", "allgather"): pass',
        'ABBREVIATIONS = {"allreduce": "AR", "twoshot": "2S"}',
        'if spec == "none": pass',
    ]
    for line in decisions:
        assert name_decisions(line, "x.py", compressors, schemes), line
    fine = ['if collective == "allreduce": pass',  # a round's primitive, not a scheme
            'ok = compressor.collectives_of_rounds()[-1] == "allreduce"',
            'if self.action == "compress": pass', 'rounds = ("allreduce", "allreduce")',
            'STEPS = {"allreduce": 2.0, "allgather": 1.0, "reduce_scatter": 1.0}',
            'DEFAULTS = {"threshold": 0.75, "window": 10}']
    for line in fine:
        assert not name_decisions(line, "x.py", compressors, schemes), line


def test_every_scheme_names_its_pricing():
    """One registry holds a scheme's exchange and its pricing: every registered scheme's
    ``pricing`` resolves to a cost model."""
    assert all(isinstance(scheme_cost(name), SchemeCost) for name in SCHEMES)


def _classes(path: Path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef):
            yield node.name, node.end_lineno - node.lineno + 1


def test_every_runtime_class_is_small():
    sizes = {f"{path.name}:{name}": lines for path in sorted((PACKAGE / "runtime").glob("*.py"))
             for name, lines in _classes(path)}
    assert sizes and max(sizes.values()) < MAX_RUNTIME_CLASS_LINES, \
        sorted(sizes.items(), key=lambda item: -item[1])[:3]


def _stage(module: str) -> str:
    return ".".join(module.split(".")[:2])


def test_no_two_stages_import_each_other():
    """The stages' import graph (every import, inside functions too) has no cycle."""
    from test_package import import_graph

    _, every = import_graph()
    stages = nx.DiGraph()
    for source, target in every.edges:
        if _stage(source) != _stage(target):
            stages.add_edge(_stage(source), _stage(target))
    cycles = list(nx.simple_cycles(stages))
    assert not cycles, cycles


def import_cycles(graph: nx.DiGraph) -> list[str]:
    """Every cycle of ``graph``, each as one line ``a -> b -> ... -> a`` starting at its
    first name in order, the lines sorted (so a failure reads the same every run)."""
    lines = []
    for cycle in nx.simple_cycles(graph):
        start = cycle.index(min(cycle))
        ordered = cycle[start:] + cycle[:start]
        lines.append(" -> ".join([*ordered, ordered[0]]))
    return sorted(lines)


def test_no_two_modules_import_each_other():
    """The modules' import graph (every import, inside functions too; a package's
    ``__init__`` a module of its own, ``from package import module`` an import of that
    module) has no cycle, not even inside one stage."""
    from test_package import import_graph

    _, every = import_graph(submodules=True)
    cycles = import_cycles(every)
    assert not cycles, "bytecomp's modules import each other:\n" + "\n".join(cycles)


def test_the_cycle_finder_finds_a_planted_cycle():
    planted = nx.DiGraph([("x.b", "x.c"), ("x.c", "x.a"), ("x.a", "x.b"), ("x.a", "x.d"),
                          ("x.e", "x.f"), ("x.f", "x.e")])
    assert import_cycles(planted) == ["x.a -> x.b -> x.c -> x.a", "x.e -> x.f -> x.e"]
    assert import_cycles(nx.DiGraph([("x.a", "x.b"), ("x.b", "x.c"), ("x.a", "x.c")])) == []


def _runtime_types(hint) -> type | tuple[type, ...]:
    """What a value of the annotation ``hint`` is at run time, as REQUIRED_FIELDS names
    it (a nested TypedDict a dict; a float may be written as an int)."""
    if typing.is_typeddict(hint):
        return dict
    kind = typing.get_origin(hint) or hint
    return (int, float) if kind is float else kind


def test_the_required_fields_are_profile_meta_s():
    """profile.yaml's required fields are ProfileMeta's keys, of its types, in its order."""
    hints = typing.get_type_hints(ProfileMeta)
    assert set(REQUIRED_FIELDS) <= set(hints)
    assert {name: _runtime_types(hints[name]) for name in REQUIRED_FIELDS} == REQUIRED_FIELDS
    assert [name for name in hints if name in REQUIRED_FIELDS] == list(REQUIRED_FIELDS)


def test_the_written_files_keys_are_declared():
    """Every key of the shipped profiles and of a calibration is declared on ProfileMeta
    or CalibrationMeta; a profile's in the declaration's order."""
    root = PACKAGE.parent
    order = list(typing.get_type_hints(ProfileMeta))
    for name in ("cnn", "transformer"):
        meta = yaml.safe_load((root / "profiles" / name / "profile.yaml").read_text())
        assert set(meta) <= set(order), name
        assert list(meta) == sorted(meta, key=order.index), name
        assert set(meta["model"]) <= set(typing.get_type_hints(ModelMeta)), name
    calibration = root / "tests" / "fixtures" / "calibration-1x2" / "calibration.yaml"
    assert set(yaml.safe_load(calibration.read_text())) <= \
        set(typing.get_type_hints(CalibrationMeta))


MAX_MODULE_LINES = 500
# Module names that two packages share for the same job: each command's rank side
SHARED_NAMES = {"runner.py": "the rank side of a command (profiler/: profile, bencher/: bench)"}


def long_modules_without_a_reason(root: Path, most: int = MAX_MODULE_LINES) -> list[str]:
    """The modules under ``root`` of more than ``most`` lines whose docstring gives no
    reason for their length (a paragraph starting "Over 500 lines:")."""
    found = []
    for path in sorted(root.rglob("*.py")):
        source = path.read_text()
        lines = source.count("\n")
        docstring = ast.get_docstring(ast.parse(source)) or ""
        if lines > most and not any(paragraph.startswith("Over 500 lines:")
                                    for paragraph in docstring.split("\n\n")):
            found.append(f"{path.relative_to(root.parent)}: {lines} lines")
    return found


def test_no_module_is_long_without_a_reason():
    """A module of more than 500 lines says why in its docstring ("Over 500 lines: ...");
    otherwise it is split by role."""
    found = long_modules_without_a_reason(PACKAGE)
    assert not found, "\n".join(found)


def test_the_length_check_finds_a_long_module(tmp_path):
    package = tmp_path / "package"
    package.mkdir()
    (package / "long.py").write_text('"""A module."""\n' + "x = 1\n" * 600)
    (package / "said.py").write_text('"""A module.\n\nOver 500 lines: one table."""\n' +
                                     "x = 1\n" * 600)
    (package / "short.py").write_text('"""A module."""\n' + "x = 1\n" * 10)
    assert long_modules_without_a_reason(package) == ["package/long.py: 601 lines"]


def test_no_two_modules_share_a_name_for_different_jobs():
    """Two modules of one name are one job in two packages (SHARED_NAMES says which);
    a package's __init__ and __main__ aside."""
    by_name: dict[str, list[str]] = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path.name not in ("__init__.py", "__main__.py"):
            by_name.setdefault(path.name, []).append(str(path.relative_to(PACKAGE)))
    shared = {name: paths for name, paths in by_name.items()
              if len(paths) > 1 and name not in SHARED_NAMES}
    assert not shared, shared
