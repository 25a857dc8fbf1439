"""Workload factories the benchmarks profile as a user would (``--model
bench_factories:NAME`` with ``benchmarks/`` on ``PYTHONPATH``)."""

from __future__ import annotations

SEQ_LEN = 64


def charlstm():
    """A character-level LSTM language model on the standard library's text (the bytes of
    its own modules; validation on modules it never trains on), trained as such models
    often are: SGD with momentum 0.9 at a learning rate of 1, gradients clipped to 1."""
    from bytecomp import Recipe
    from bytecomp.training.builtin_models import LSTMLanguageModel
    from bytecomp.training.data import TextWindows, validation_batches

    def validation(batch_size):
        return validation_batches(SEQ_LEN, batch_size, 8)

    return Recipe(LSTMLanguageModel(256, 256, 2), TextWindows(SEQ_LEN),
                  optimizer="sgd:lr=1,momentum=0.9,clip=1", validation=validation,
                  batch_size=16)
