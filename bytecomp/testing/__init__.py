"""Support for tests and benchmarks (synthetic profiles) and the public conformance check
of a compressor (:func:`check_compressor`); not used by the product path."""

from bytecomp.testing.conformance import check_compressor

__all__ = ["check_compressor"]
