"""Correctness probes that drive a real engine (never imported by the library)."""
