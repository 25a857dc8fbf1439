"""The janitor of one emulated cluster: removes its namespaces, links and qdiscs once
the ``bytecomp emulate`` that made them is gone, even when it was killed outright.

``EmulatedCluster`` starts ``python -m bytecomp.emulate.janitor RUN_ID`` in a session
of its own (a Ctrl-C to the terminal does not reach it) with a pipe as its standard
input and keeps the pipe's other end. The janitor blocks reading it; the read ends
when the parent closes it after its own teardown or when the kernel closes it because
the parent died (SIGKILL included). It then kills what still runs in the run's
namespaces, deletes them and the run's links (a no-op after a clean teardown) and
exits: it outlives its parent by that cleanup alone, a second or so.

It imports the standard library and :mod:`bytecomp.emulate.netns` only (no torch).
"""

from __future__ import annotations

import os
import re
import signal
import sys


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not re.fullmatch(r"[0-9a-f]{6}", argv[0]):
        print("usage: python -m bytecomp.emulate.janitor RUN_ID (6 hex digits)",
              file=sys.stderr)
        return 2
    for sig in (signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_IGN)  # the parent's terminal going away is our cue
    try:
        while os.read(0, 4096):  # nothing is ever sent: returns b"" when the parent is gone
            pass
    except OSError:
        pass
    import time

    from bytecomp.emulate.netns import reap_run

    reap_run(argv[0])
    time.sleep(0.5)  # an `ip` the parent started just before it died may still be creating
    reap_run(argv[0])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
