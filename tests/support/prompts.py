"""Prompt builders shared by engine tests."""

from kvtier.bench.prompts import random_prompt as _random_prompt


def random_prompt(seed: int, length: int, vocab: int = 2048) -> list[int]:
    """Token ids in ``[3, vocab)`` (the tiny models' vocabulary by default) unlikely to share a
    prefix with any other seed's prompt; kvtier.bench's builder with the tests' defaults."""
    return _random_prompt(seed, length, vocab)
