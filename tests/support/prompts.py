"""Prompt builders shared by engine tests."""

import random


def random_prompt(seed: int, length: int, vocab: int = 2048) -> list[int]:
    """Token ids unlikely to share a prefix with any other seed's prompt."""
    rng = random.Random(seed)
    return [rng.randrange(3, vocab) for _ in range(length)]
