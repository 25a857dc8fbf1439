"""The profile directory: ``profile.yaml`` plus CSV tables (docs/formats.md).

``save_profile`` writes it atomically; ``load_profile`` validates every file
and reports a bad one with its path, the column or field and the reason;
``check_profile`` validates a :class:`Profile` held in memory (perhaps edited) with the
same checks, naming the attribute instead of the file.

profile.yaml's checks are :mod:`bytecomp.profile_meta`, the tables' are
:mod:`bytecomp.profile_tables`. It sits beside :mod:`bytecomp.plan_file` rather than in a stage: the profiler writes
profiles, the models and the planner read them, and neither stage imports the other
for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from bytecomp.errors import BytecompError
from bytecomp.files import check_input_directory, directory_atomic
from bytecomp.profile_meta import REQUIRED_FIELDS, ProfileMeta, check_meta
from bytecomp.profile_tables import (
    COPY_DIRECTIONS,
    OPTIONAL_COLUMNS,
    OPTIONAL_TABLES,
    TABLES,
    check_collectives,
    check_fidelity,
    check_probe,
    check_quality_fits,
    check_specs,
    check_sweep,
    check_tensors,
    empty_table,
    load_table,
    row_fail,
    typed_table,
)
from bytecomp.safe_yaml import dump_yaml
from bytecomp.schema import check_document, fail, read_document

FORMAT_VERSION = 1  # profile.yaml's and calibration.yaml's


@dataclass
class Profile:
    """A measured profile: ``meta`` is profile.yaml, the rest its tables."""

    meta: ProfileMeta
    tensors: pd.DataFrame
    collectives: pd.DataFrame
    compressors: pd.DataFrame
    copies: pd.DataFrame = field(default_factory=lambda: empty_table("copies"))
    path: Path | None = None
    fidelity: pd.DataFrame = field(default_factory=lambda: empty_table("fidelity"))
    probe: pd.DataFrame = field(default_factory=lambda: empty_table("probe"))
    aggregation: pd.DataFrame = field(default_factory=lambda: empty_table("aggregation"))

    @property
    def has_fidelity(self) -> bool:
        """Whether the profile measured gradient fidelity (profiles before it did not)."""
        return not self.fidelity.empty

    @property
    def probe_gains(self) -> dict[str, float]:
        """The convergence probe's gain by spec, where it recorded one."""
        if "gain" not in self.probe.columns:
            return {}
        return {str(row.spec): float(row.gain) for row in self.probe.itertuples()}

    @property
    def steps_factors(self) -> dict[str, float]:
        """The convergence probe's steps factor by spec (empty: no probe)."""
        return {str(row.spec): float(row.steps_factor) for row in self.probe.itertuples()}

    def recipe_optimizer(self) -> str | None:
        """The optimizer spec the profile's recipe trained with; None where the factory
        built its own (building the workload builds it again) or the profile predates
        recipes (the workload's default then)."""
        from bytecomp.recipe import parse_optimizer

        return self._recipe_spec("optimizer", parse_optimizer)

    def recipe_scheduler(self) -> str | None:
        """The learning-rate schedule spec the profile's recipe trained with; None where it
        had none, the factory built its own (building the workload builds it again) or
        the profile predates schedules."""
        from bytecomp.recipe import parse_scheduler

        return self._recipe_spec("scheduler", parse_scheduler)

    def _recipe_spec(self, key: str, parse) -> str | None:
        """The recipe's ``key`` spec as ``parse`` reads it; None where the recipe has none
        or one ``parse`` does not read (the factory's own: "the factory's (...)")."""
        spec = (self.meta.get("recipe") or {}).get(key)
        if not isinstance(spec, str):
            return None
        try:
            return parse(spec).spec
        except BytecompError:
            return None

    def evidence(self) -> tuple[bool, str]:
        """What convergence evidence the profile holds, in words, and whether it holds any
        (measured steps factors) or only the one-step gains."""
        probe = self.meta.get("probe") or {}
        if self.steps_factors:
            batches = probe.get("batches", "validation")
            return True, (f"the convergence probe ({int(probe.get('steps', 0))} steps of each "
                          f"compressor, losses on {batches}) calibrates the gains")
        if not self.has_fidelity:
            return False, "no convergence evidence: the profile measured neither gains nor a probe"
        if probe.get("informative") is False:
            return False, (f"raw gains only: in the convergence probe ({probe.get('ran_steps')} "
                           f"steps) fp32 DDP's loss fell {100 * probe['fp32_improvement']:.1f}%, "
                           f"too little to tell compressors apart")
        return False, ("raw gains only: the profile has no convergence probe (bytecomp profile "
                       "--probe-steps N measures one)")

    @property
    def world_size(self) -> int:
        return int(self.meta["world_size"])

    @property
    def nodes(self) -> int:
        return int(self.meta["nodes"])

    @property
    def ranks_per_node(self) -> int:
        return int(self.meta["ranks_per_node"])

    @property
    def fingerprint(self) -> str:
        return self.meta["model"]["fingerprint"]

    @property
    def device_type(self) -> str:
        return self.meta["device"]["type"]

    @property
    def bucket_cap_mb(self) -> float:
        return float(self.meta["bucket_cap_mb"])

    def time_ms(self, name: str, statistic: str = "median_ms") -> float:
        return float(self.meta["times"][name][statistic])

    @property
    def label(self) -> str:
        return str(self.path) if self.path else self.meta["model"]["name"]


def save_profile(profile: Profile, directory, force: bool = False) -> Path:
    """Write ``directory/profile.yaml`` and the CSV tables, atomically."""
    with directory_atomic(directory, force) as temporary:
        (temporary / "profile.yaml").write_text(
            dump_yaml(profile.meta, sort_keys=False, default_flow_style=False))
        for name in TABLES:
            table = getattr(profile, name)
            columns = list(TABLES[name]) + [c for c in OPTIONAL_COLUMNS.get(name, {})
                                            if c in table.columns]
            table.to_csv(temporary / f"{name}.csv", index=False, columns=columns)
    return Path(directory)


def _load_meta(path: Path) -> ProfileMeta:
    if not path.exists():
        fail(path, "missing (is this a profile directory made by bytecomp profile?)")
    return check_meta(path, read_document(path, "profile file", REQUIRED_FIELDS,
                                          FORMAT_VERSION))


def load_profile(directory) -> Profile:
    """Read and validate a profile directory: every file a regular file of sane size,
    every number finite and in range, and the tables consistent with each other and
    with profile.yaml."""
    directory = check_input_directory(directory, "profile directory")
    if not (directory / "profile.yaml").exists() and (directory / "calibration.yaml").exists():
        raise BytecompError(f"{directory} is a calibration (bytecomp profile --calibrate-only), "
                            f"not a profile: profile a model with --calibration {directory}")
    return _validated(_load_meta(directory / "profile.yaml"), directory / "profile.yaml",
                      lambda name: load_table(directory, name, name not in OPTIONAL_TABLES),
                      lambda name: directory / f"{name}.csv", directory)


def check_profile(profile: Profile) -> Profile:
    """``profile`` (from :func:`load_profile`, perhaps edited in memory, or built) checked
    as :func:`load_profile` checks a directory, each failure one line naming the
    attribute (``Profile(profiles/cnn).tensors: column 'ready_ms', row 3: ...``); a
    checked copy, its tables of the columns' types."""
    source = f"Profile({profile.path if profile.path is not None else 'in memory'})"
    meta = check_meta(f"{source}.meta", check_document(f"{source}.meta", profile.meta,
                                                       REQUIRED_FIELDS, FORMAT_VERSION))

    def table(name: str) -> pd.DataFrame:
        given = getattr(profile, name)
        if not isinstance(given, pd.DataFrame):
            fail(f"{source}.{name}", f"must be a pandas DataFrame, got "
                                      f"{type(given).__name__}")
        return typed_table(f"{source}.{name}", name, given.reset_index(drop=True))

    return _validated(meta, f"{source}.meta", table, lambda name: f"{source}.{name}",
                      profile.path)


def _validated(meta: ProfileMeta, meta_path: Path | str, table, where,
               path: Path | None) -> Profile:
    """The profile of ``meta`` (checked) and of the tables ``table(name)`` gives (typed),
    each table checked against ``meta`` and the others, in the order load_profile reads
    them; ``where(name)``: the table as a message names it."""
    tensors = table("tensors")
    check_tensors(where("tensors"), tensors, meta)
    collectives = table("collectives")
    check_collectives(where("collectives"), collectives, meta)
    compressors = table("compressors")
    check_sweep(where("compressors"), compressors)
    check_quality_fits(meta_path, meta.get("quality"), collectives, compressors)
    copies = table("copies")
    row_fail(where("copies"), copies, ~copies["direction"].isin(COPY_DIRECTIONS),
              "direction", f"is not one of {', '.join(COPY_DIRECTIONS)}")
    fidelity = table("fidelity")
    check_specs(where("fidelity"), fidelity, "spec")
    check_fidelity(where("fidelity"), fidelity, tensors, compressors)
    probe = table("probe")
    check_probe(where("probe"), probe)
    aggregation = table("aggregation")
    check_sweep(where("aggregation"), aggregation)
    return Profile(meta, tensors, collectives, compressors, copies, path, fidelity, probe,
                   aggregation)


def profile_files(directory) -> list[Path]:
    """The files :func:`load_profile` reads: a command's inputs, which no output may
    overwrite."""
    return [Path(directory) / "profile.yaml"] + [Path(directory) / f"{name}.csv"
                                                  for name in TABLES]
