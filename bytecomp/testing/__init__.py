"""Support for tests and benchmarks (synthetic profiles); not used by the product path."""
