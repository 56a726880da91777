"""Helpers shared by the test suite, ``ksctl verify`` and the benchmarks."""
