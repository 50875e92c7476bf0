"""Benchmarks that drive real engines and print figures (never imported by the library)."""
