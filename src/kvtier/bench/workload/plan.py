"""The requests of a workload, in sending order, with their arrival times.

A plan is pure data, a function of the shape and its seed: the same arguments give the same
requests, texts and arrival times in every process (the tests pin this).

Workloads (the shapes users publish their offloading results with):

* ``chat``: ``users`` users, ``rounds`` rounds each. Every user's first message follows one
  system prompt that all users share; every later round appends the user's previous answer
  (the server's text) and a new question, so the prompt grows by a question and an answer each
  round. Requests go round by round (every user's round 1, then every user's round 2): a user's
  history is reused after all the other users' turns, the distance at which it falls out of an
  engine's cache when the users' histories outgrow it.
* ``documents``: ``documents`` documents, each asked ``questions`` questions (the document,
  then a short question). ``tile`` order asks every document once, then every document again
  (the longest reuse distance: the first to fail when the cache is too small); ``random``
  shuffles all questions. A request's round is how many times its document was asked before.
* ``no-reuse``: the chat's requests with the same prompt lengths, every prompt unique from its
  first token: what a tier costs when nothing comes back.
* ``restart``: the chat, with a command run between rounds (``restart_round``, by default the
  middle one), e.g. restarting the server: rounds before it and after it are two segments.

Arrivals: with ``qps`` > 0, a Poisson process (exponential gaps of mean ``1/qps``, seeded); a
request is sent at its arrival time or when its user's previous round has been answered,
whichever is later. With ``qps`` = 0 every request arrives at once and the number in flight
(``concurrency``) paces the run. A segment's clock starts when the segment starts.
"""

from __future__ import annotations

import math
import random
from dataclasses import asdict, dataclass

from kvtier.bench.workload.text import tagged

WORKLOADS = ("chat", "documents", "no-reuse", "restart")
ORDERS = ("tile", "random")

#: (role, content) of one chat message.
Message = tuple[str, str]


@dataclass(frozen=True)
class Shape:
    """What a workload sends; every size is in tokens (about: see ``text``)."""

    workload: str
    users: int = 8  # chat, no-reuse, restart: users (conversations)
    rounds: int = 4  # rounds per user
    system_tokens: int = 500  # the system prompt all users share
    question_tokens: int = 100  # each user message (chat) or question (documents)
    answer_tokens: int = 50  # max_tokens of every request
    documents: int = 8  # documents: how many
    document_tokens: int = 2000  # documents: the length of each
    questions: int = 2  # documents: questions per document
    order: str = "tile"  # documents: tile or random
    seed: int = 0
    restart_round: int | None = None  # restart: first round after the command (None: middle)

    def __post_init__(self) -> None:
        if self.workload not in WORKLOADS:
            raise ValueError(f"workload {self.workload!r}: use one of {', '.join(WORKLOADS)}")
        if self.order not in ORDERS:
            raise ValueError(f"order {self.order!r}: use one of {', '.join(ORDERS)}")
        for name in (
            "users",
            "rounds",
            "documents",
            "questions",
            "answer_tokens",
            "question_tokens",
            "document_tokens",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)}: give at least 1")
        if self.system_tokens < 0:
            raise ValueError(f"system_tokens={self.system_tokens}: give 0 or more")
        if self.workload == "restart" and self.rounds < 2:
            raise ValueError(f"restart: rounds={self.rounds}; give at least 2 (before, after)")
        if self.restart_round is not None and not 1 <= self.restart_round < self.rounds:
            raise ValueError(
                f"restart_round={self.restart_round}: give a round from 1 to {self.rounds - 1}"
            )

    @property
    def split_round(self) -> int | None:
        """The first round after the command (restart workload only)."""
        if self.workload != "restart":
            return None
        return self.rounds // 2 if self.restart_round is None else self.restart_round

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class PlannedRequest:
    """One request: the messages it adds to its conversation, and when it may be sent."""

    index: int  # position in sending order
    unit: int  # the user (chat, no-reuse, restart) or the document (documents)
    round: int  # 0-based
    messages: tuple[Message, ...]  # appended to the conversation's history
    conversation: str | None  # a history this request extends and grows; None: none
    segment: int  # 0; 1 after the restart command
    arrival_s: float  # earliest send time, seconds after its segment started


def arrival_gaps(count: int, qps: float, seed: int) -> list[float]:
    """Gaps before each of ``count`` arrivals of a Poisson process of rate ``qps`` (the first
    gap 0); all 0 for ``qps`` = 0 (everything arrives at once)."""
    if qps < 0:
        raise ValueError(f"qps={qps}: give a rate >= 0")
    if qps == 0:
        return [0.0] * count
    rng = random.Random(f"{seed}/arrivals")
    return [0.0] + [rng.expovariate(qps) for _ in range(count - 1)]


def _chat(shape: Shape) -> list[tuple[int, int, tuple[Message, ...], str | None]]:
    seed = shape.seed
    system = tagged("system:", f"{seed}/system", shape.system_tokens)
    out = []
    for r in range(shape.rounds):
        for u in range(shape.users):
            question = tagged(f"user {u} round {r}:", f"{seed}/q/{u}/{r}", shape.question_tokens)
            if shape.workload == "no-reuse":
                # One unique text as long as the chat's history would be at this round.
                history = shape.system_tokens + r * (shape.question_tokens + shape.answer_tokens)
                unique = tagged(f"request {u} {r}:", f"{seed}/unique/{u}/{r}", history)
                out.append((u, r, (("system", unique), ("user", question)), None))
            elif r == 0:
                out.append((u, r, (("system", system), ("user", question)), f"user-{u}"))
            else:
                out.append((u, r, (("user", question),), f"user-{u}"))
    return out


def _documents(shape: Shape) -> list[tuple[int, int, tuple[Message, ...], str | None]]:
    seed = shape.seed
    docs = [
        tagged(f"doc {d}:", f"{seed}/doc/{d}", shape.document_tokens)
        for d in range(shape.documents)
    ]
    asks = [(d, q) for q in range(shape.questions) for d in range(shape.documents)]
    if shape.order == "random":
        random.Random(f"{seed}/order").shuffle(asks)
    seen = [0] * shape.documents
    out = []
    for d, q in asks:
        question = tagged(f"question {q}:", f"{seed}/dq/{d}/{q}", shape.question_tokens)
        # The round is the document's occurrence so far: round 0 is always its first (cold).
        out.append((d, seen[d], (("user", docs[d] + "\n\n" + question),), None))
        seen[d] += 1
    return out


def build(shape: Shape, qps: float = 0.0) -> list[PlannedRequest]:
    """The requests of ``shape`` in sending order (see the module docstring)."""
    rows = _documents(shape) if shape.workload == "documents" else _chat(shape)
    gaps = arrival_gaps(len(rows), qps, shape.seed)
    split = shape.split_round
    plan = []
    clock = 0.0
    segment = 0
    for index, ((unit, rnd, messages, conversation), gap) in enumerate(
        zip(rows, gaps, strict=True)
    ):
        now_segment = 1 if split is not None and rnd >= split else 0
        if now_segment != segment:
            segment, clock = now_segment, 0.0  # the second segment's clock starts at its start
        else:
            clock += gap
        plan.append(PlannedRequest(index, unit, rnd, messages, conversation, segment, clock))
    return plan


def users_for_pool(
    pool_tokens: int, multiple: float, rounds: int, system: int, question: int, answer: int
) -> int:
    """Users whose histories, at their last round, take ``multiple`` times an engine cache of
    ``pool_tokens`` tokens (the system prompt counted once: the users share it)."""
    per_user = rounds * (question + answer)
    return max(1, math.ceil((multiple * pool_tokens - system) / per_user))


def documents_for_pool(pool_tokens: int, multiple: float, document: int, question: int) -> int:
    """Documents that take ``multiple`` times an engine cache of ``pool_tokens`` tokens."""
    return max(1, math.ceil(multiple * pool_tokens / (document + question)))
