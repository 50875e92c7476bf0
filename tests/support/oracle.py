"""The resume oracle: what a restored prefix must produce.

A restored prefix plus a recomputed tail runs different kernel batch shapes than one cold
prefill, so comparing a restore with a cold run can flip a near-tie token on correct code. The
right reference is a *no-offload resume of the same prefix*: the same prompt served again from
an engine's own prefix cache, which resumes from the same number of cached tokens. A restore
must match it token for token (see shared/research/reference-systems.md).
"""

from dataclasses import dataclass

from kvtier.bench.harness.engine import Engine, GenerateResult
from kvtier.errors import KvtierError


class OracleMismatch(KvtierError):
    """A restored generation differs from the no-offload resume of the same prefix."""


@dataclass(frozen=True)
class ResumeReference:
    """The no-offload resume of one prompt."""

    token_ids: tuple[int, ...]
    num_cached_tokens: int


def resume_reference(engine: Engine, prompt: list[int], max_tokens: int) -> ResumeReference:
    """Serve ``prompt`` twice on ``engine``; the second run resumes from its own prefix cache.

    ``engine`` should have no offloading, or at least must not have been reset in between, so
    the second run is a local prefix-cache hit (checked).
    """
    engine.generate_one(prompt, max_tokens)
    hit, _ = engine.generate_one(prompt, max_tokens)
    if hit.num_cached_tokens == 0:
        raise OracleMismatch("reference run was not a prefix-cache hit; is prefix caching on?")
    return ResumeReference(tuple(hit.token_ids), hit.num_cached_tokens)


def check_restore(restored: GenerateResult, reference: ResumeReference) -> None:
    """Raise ``OracleMismatch`` unless ``restored`` equals the reference, token for token."""
    if tuple(restored.token_ids) != reference.token_ids:
        first = next(
            (
                i
                for i, (a, b) in enumerate(
                    zip(restored.token_ids, reference.token_ids, strict=False)
                )
                if a != b
            ),
            min(len(restored.token_ids), len(reference.token_ids)),
        )
        got = restored.token_ids[first : first + 5]
        want = list(reference.token_ids[first : first + 5])
        raise OracleMismatch(
            f"restored output differs from the no-offload resume at token {first}: {got} vs "
            f"{want} (cached {restored.num_cached_tokens} vs {reference.num_cached_tokens})"
        )
