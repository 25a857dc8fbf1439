"""Spawning from a script: multiprocessing's spawn runs the script again in every rank, so
a top-level call of bytecomp.profile/plan/bench outside ``if __name__ == "__main__":``
is refused at once, in one line that says to add the guard; with the guard it runs."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bytecomp.mainguard import guarded

ROOT = Path(__file__).resolve().parents[1]

UNGUARDED = '''import bytecomp

profile = bytecomp.profile("mlp", nproc=2, quick=True, probe_steps=0, out="p", force=True)
'''


@pytest.mark.parametrize("source, line, expected", [
    (UNGUARDED, 3, False),
    ('import bytecomp\n\nif __name__ == "__main__":\n    bytecomp.profile("mlp")\n', 4, True),
    ("if '__main__' == __name__:\n    main()\n", 2, True),
    ('def main():\n    pass\n\ntry:\n    if __name__ == "__main__":\n        main()\n'
     'except KeyboardInterrupt:\n    pass\n', 6, True),
    ('if __name__ == "__main__":\n    pass\nelse:\n    main()\n', 4, False),  # the else
    ('if __name__ != "__main__":\n    main()\n', 2, False),
    ("this is not python(\n", 1, True),  # unparsable: nothing refused on a guess
])
def test_a_line_is_guarded_only_inside_the_main_block(source, line, expected):
    assert guarded(source, line) is expected


def _run(tmp_path: Path, source: str, timeout: float = 120) -> subprocess.CompletedProcess:
    script = tmp_path / "train_script.py"
    script.write_text(source)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=timeout, env=env)


@pytest.mark.slow
@pytest.mark.parametrize("call", [
    'bytecomp.profile("mlp", nproc=2, quick=True, probe_steps=0, out="p", force=True)',
    'bytecomp.plan("profiles/none", verify=True)',  # bench calls the same check
])
def test_a_script_without_the_guard_gets_one_line_at_once(tmp_path, call):
    """Refused before anything is read or spawned: the line names the script and its
    line and says what to add; no rank started, no output written."""
    started = time.monotonic()
    done = _run(tmp_path, f"import bytecomp\n\n{call}\n")
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last == ("bytecomp.errors.BytecompError: train_script.py, line 3: bytecomp starts "
                    "its ranks with multiprocessing's spawn, which runs train_script.py again "
                    "in each of them: put the code that calls bytecomp under "
                    "`if __name__ == \"__main__\":`"), done.stderr
    assert "RankFailed" not in done.stderr and not (tmp_path / "p").exists()
    assert time.monotonic() - started < 60


@pytest.mark.slow
def test_a_guarded_script_is_not_refused(tmp_path):
    """The same call under the guard, from a function the guard calls, passes the check:
    it fails later, on the profile it names, not on the guard."""
    done = _run(tmp_path, 'import bytecomp\n\n\ndef main():\n'
                          '    bytecomp.plan("profiles/none", verify=True)\n\n\n'
                          'if __name__ == "__main__":\n    main()\n')
    assert done.returncode != 0
    assert "profiles/none" in done.stderr.strip().splitlines()[-1]
    assert "__main__" not in done.stderr.strip().splitlines()[-1]
