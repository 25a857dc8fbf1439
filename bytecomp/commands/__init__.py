"""The four commands from start to finish, one module per command: :mod:`.profile`,
:mod:`.plan`, :mod:`.simulate` and :mod:`.bench`, each what its function in
:mod:`bytecomp.api` calls once the options are checked (and what the CLI reaches
through it). A command's module checks its inputs and outputs, runs its stage's work
(the ranks of :mod:`bytecomp.profiler` or :mod:`bytecomp.bencher`, the search of
:mod:`bytecomp.search`, the simulator of :mod:`bytecomp.timeline`) and returns its
result.
"""
