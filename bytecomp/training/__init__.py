"""Training the user's model, for every command: the workload (the model, its recipe and
its data: :mod:`.workloads`, :mod:`.builtin_models`, :mod:`.data`), training strategies
side by side to a validation loss on the same batches (:mod:`.convergence`), the steps
factors read from their curves (:mod:`.factors`), and the two training runs built on
them: ``bytecomp profile``'s convergence probe (:mod:`.probe`) and ``bytecomp plan``'s
finalists (:mod:`.finalist_runs`); ``bytecomp bench --train-steps`` trains with
:mod:`.convergence` too."""
