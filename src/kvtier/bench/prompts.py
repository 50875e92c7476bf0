"""Random token-id prompts: the one builder of benchmarks, probes and the matrix runner."""

import random


def random_prompt(seed: int, length: int, vocab: int = 2048, low: int = 3) -> list[int]:
    """``length`` token ids drawn from ``[low, vocab)`` by a generator seeded with ``seed``.

    The same arguments give the same prompt; distinct seeds do not share a prefix block in
    practice. ``low`` keeps clear of a model's special tokens.
    """
    rng = random.Random(seed)
    return [rng.randrange(low, vocab) for _ in range(length)]
