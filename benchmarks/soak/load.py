"""The soak's client load: multi-turn chat sessions over shared system prompts and documents,
sent as token ids through the official ``openai`` client, each answer checked against the
resume oracle of a reference server without kvtier."""

from __future__ import annotations

import array
import bisect
import contextlib
import hashlib
import random
import statistics
import sys
import threading
import time
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import openai

from benchmarks.soak.cluster import ModelSpec, Served
from kvtier.bench.harness.server import ServerEngine
from kvtier.policy.deadline import DeadlineRule

#: Output tokens per request (greedy, EOS ignored so every answer has this length).
MAX_TOKENS = 4
#: Output tokens of a request that hangs up on purpose (it closes after the first).
DISCONNECT_TOKENS = 32
BLOCK_TOKENS = 128
SYSTEM_PROMPTS = 3
SYSTEM_TOKENS = 256
DOCUMENTS = 6
#: Sessions open at once per group (each is served by one request at a time).
SESSIONS_PER_GROUP = 6
MAX_TURNS = 6
#: A server reached down or restarting is retried this often (after it is ready again).
ATTEMPTS = 4


@dataclass
class Prompts:
    """Shared material of one model: system prompts and documents many sessions reuse."""

    model: ModelSpec
    systems: list[list[int]]
    documents: list[list[int]]

    @classmethod
    def build(cls, model: ModelSpec, rng: random.Random) -> Prompts:
        return cls(
            model,
            [tokens(rng, model.vocab, SYSTEM_TOKENS) for _ in range(SYSTEM_PROMPTS)],
            [tokens(rng, model.vocab, rng.choice((128, 256, 384, 512))) for _ in range(DOCUMENTS)],
        )

    def opening(self, rng: random.Random) -> list[int]:
        return [
            *rng.choice(self.systems),
            *rng.choice(self.documents),
            *tokens(rng, self.model.vocab, rng.randint(20, 150)),
        ]


def tokens(rng: random.Random, vocab: int, n: int) -> list[int]:
    # Ids below 3 are the tiny models' special tokens; the top of the range is left out too.
    return [rng.randrange(3, vocab - 3) for _ in range(n)]


@dataclass
class Session:
    id: str
    group: str
    model: ModelSpec
    prompt: list[int]
    turn: int = 1
    busy: bool = False


class Sessions:
    """The open sessions of every group; a finished one is replaced by a fresh one."""

    def __init__(
        self, groups: dict[str, list[Served]], prompts: dict[str, Prompts], rng: random.Random
    ) -> None:
        self._groups = groups
        self._prompts = prompts
        self._rng = rng
        self._lock = threading.Lock()
        self._count = 0
        self._open: list[Session] = []
        for group in sorted(groups):
            for _ in range(SESSIONS_PER_GROUP):
                self._open.append(self._new(group))

    def _new(self, group: str) -> Session:
        self._count += 1
        servers = self._groups[group]
        weights = [s.spec.model.session_weight for s in servers]
        model = self._rng.choices(servers, weights)[0].spec.model
        return Session(
            f"s{self._count}", group, model, self._prompts[model.name].opening(self._rng)
        )

    def checkout(self) -> tuple[Session, Served, random.Random] | None:
        """A free session, the server of its next turn (any of its group with its model) and
        an rng for the turn's own draws."""
        with self._lock:
            free = [s for s in self._open if not s.busy]
            if not free:
                return None
            session = self._rng.choice(free)
            session.busy = True
            servers = [
                s for s in self._groups[session.group] if s.spec.model.name == session.model.name
            ]
            # A turn goes to a neighbour while its server restarts (a request already sent
            # to it waits and retries instead).
            servers = [s for s in servers if s.ready.is_set()] or servers
            return session, self._rng.choice(servers), random.Random(self._rng.getrandbits(32))

    def checkin(self, session: Session, answer: list[int] | None, rng: random.Random) -> None:
        """Append the answer (if it was right) and the next user message, or close the session
        when it is out of turns or room."""
        with self._lock:
            session.busy = False
            grown = [
                *session.prompt,
                *(answer or []),
                *tokens(rng, session.model.vocab, rng.randint(20, 150)),
            ]
            if session.turn >= MAX_TURNS or len(grown) > session.model.max_prompt_tokens:
                self._open[self._open.index(session)] = self._new(session.group)
                return
            session.prompt = grown
            session.turn += 1


class OracleUnavailable(Exception):
    """The reference could not resume from the requested number of cached tokens."""


class Oracle:
    """Expected greedy output of a prompt resumed from ``cached`` prompt tokens, from a plain
    vLLM server of the same model and settings (tests/support/engine.py's ``Oracle`` over
    HTTP): reset, serve ``prompt[:cached]``, then ``prompt``; memoised per (prompt, cached)."""

    def __init__(self, reference: ServerEngine) -> None:
        self.reference = reference
        self._lock = threading.Lock()
        # Keyed by a digest of the prompt: an hour's thousands of 2,000-token prompts held as
        # tuples would take hundreds of MiB of the runner.
        self._memo: dict[tuple[bytes, int, int], tuple[int, ...]] = {}
        #: (prompt tokens, cold TTFT seconds) of every cold reference run.
        self.cold: list[tuple[int, float]] = []

    def expected(self, prompt: list[int], cached: int, max_tokens: int) -> tuple[int, ...]:
        digest = hashlib.blake2b(array.array("i", prompt).tobytes(), digest_size=16).digest()
        key = (digest, cached, max_tokens)
        with self._lock:
            if key in self._memo:
                return self._memo[key]
            client = self.reference.client
            for _ in range(2):
                client.reset_prefix_cache()
                if cached:
                    client.complete_stream(prompt[:cached], 1, ignore_eos=True)
                out = client.complete_stream(prompt, max_tokens, ignore_eos=True)
                if (out.cached_tokens or 0) == cached:
                    break
            else:
                raise OracleUnavailable(
                    f"reference resumed from {out.cached_tokens} cached tokens, want {cached}"
                )
            if cached == 0:
                self.cold.append((len(prompt), out.ttft_s))
            self._memo[key] = tuple(out.token_ids)
            return self._memo[key]


class Bounds:
    """A request's bound: the tier's load-deadline ceiling plus one cold prefill of its prompt
    length, the prefill taken from the reference's cold runs (start-up calibration, then every
    cold oracle run) as the median of the nearest lengths."""

    def __init__(self, oracles: dict[str, Oracle]) -> None:
        self.deadline_s = DeadlineRule().ceiling_s
        self._oracles = oracles

    def calibrate(self, model: ModelSpec, rng: random.Random) -> dict[int, float]:
        oracle = self._oracles[model.name]
        lengths = [256, 768, min(1536, model.max_prompt_tokens)]
        for length in lengths:
            for _ in range(2):
                oracle.expected(tokens(rng, model.vocab, length), 0, 1)
        return {length: self.cold_prefill_s(model.name, length) for length in lengths}

    def cold_prefill_s(self, model: str, prompt_tokens: int) -> float:
        runs = sorted(self._oracles[model].cold)
        if not runs:
            return 0.0
        i = bisect.bisect_left(runs, (prompt_tokens, 0.0))
        near = runs[max(0, i - 3) : i + 3]
        return statistics.median(ttft for _, ttft in near)

    def bound_s(self, model: str, prompt_tokens: int) -> float:
        return self.deadline_s + self.cold_prefill_s(model, prompt_tokens)


@dataclass
class Answer:
    token_ids: list[int]
    cached_tokens: int | None
    ttft_s: float | None
    disconnected: bool = False


def stream(
    client: openai.OpenAI, prompt: list[int], max_tokens: int, hang_up: bool = False
) -> Answer:
    """One greedy streamed completion of token ids; ``hang_up`` closes after the first token."""
    started = time.perf_counter()
    ttft = None
    token_ids: list[int] = []
    cached = None
    response = client.completions.create(
        model="model",
        prompt=prompt,
        max_tokens=max_tokens,
        temperature=0.0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"return_token_ids": True, "ignore_eos": True},
    )
    try:
        for chunk in response:
            usage = chunk.usage
            details = getattr(usage, "prompt_tokens_details", None) if usage else None
            if details is not None and details.cached_tokens is not None:
                cached = int(details.cached_tokens)
            if not chunk.choices:
                continue
            if ttft is None:
                ttft = time.perf_counter() - started
            choice: Any = chunk.choices[0]
            token_ids += getattr(choice, "token_ids", None) or []
            if hang_up:
                return Answer(token_ids, cached, ttft, disconnected=True)
    finally:
        response.close()
    return Answer(token_ids, cached, ttft)


@dataclass
class Load:
    """Worker threads sending session turns at a bounded rate until ``stop``."""

    servers: list[Served]
    sessions: Sessions
    oracles: dict[str, Oracle]
    bounds: Bounds
    resources: Callable[[Served], set[str]]
    active_faults: Callable[[set[str], float, float], list[int]]
    emit: Callable[..., None]
    now: Callable[[], float]
    stop: threading.Event
    rate_per_s: float
    workers: int
    per_server_in_flight: int = 2
    _clients: dict[str, openai.OpenAI] = field(default_factory=dict)
    _slots: dict[str, threading.Semaphore] = field(default_factory=dict)
    _next_send: float = 0.0
    _rate_lock: threading.Lock = field(default_factory=threading.Lock)
    _threads: list[threading.Thread] = field(default_factory=list)
    #: Cold TTFTs seen on the served servers per (model, 256-token bucket), recent ones.
    _cold_seen: dict[tuple[str, int], deque[float]] = field(
        default_factory=lambda: defaultdict(lambda: deque(maxlen=25))
    )
    requests: int = 0

    def __post_init__(self) -> None:
        for server in self.servers:
            self._clients[server.label] = openai.OpenAI(
                base_url=f"http://127.0.0.1:{server.port}/v1",
                api_key="soak",
                max_retries=0,
                timeout=self.bounds.deadline_s * 3 + 60,
            )
            self._slots[server.label] = threading.Semaphore(self.per_server_in_flight)

    def start(self) -> None:
        self._next_send = time.monotonic()
        for i in range(self.workers):
            thread = threading.Thread(target=self._work, name=f"soak-load-{i}", daemon=True)
            thread.start()
            self._threads.append(thread)

    def join(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))

    def _pace(self) -> bool:
        """Wait for the next send slot (``rate_per_s`` overall); False once stopped."""
        with self._rate_lock:
            slot = max(self._next_send, time.monotonic())
            self._next_send = slot + 1.0 / self.rate_per_s
        return not self.stop.wait(max(0.0, slot - time.monotonic()))

    def _work(self) -> None:
        while self._pace():
            picked = self.sessions.checkout()
            if picked is None:
                continue
            session, server, rng = picked
            answer = None
            try:
                answer = self.request(server, session.model, session.prompt, session, rng)
            except Exception as exc:  # a bug in the runner must not silently stop the load
                print(f"soak: load worker: {exc!r}", file=sys.stderr, flush=True)
            finally:
                self.sessions.checkin(session, answer, rng)

    def bound_s(self, model: ModelSpec, prompt_tokens: int) -> float:
        bound = self.bounds.bound_s(model.name, prompt_tokens)
        seen = self._cold_seen.get((model.name, prompt_tokens // 256))
        if seen:
            bound = max(bound, self.bounds.deadline_s + statistics.median(seen))
        return bound

    def request(
        self,
        server: Served,
        model: ModelSpec,
        prompt: list[int],
        session: Session | None,
        rng: random.Random,
        hang_up_fault: int | None = None,
    ) -> list[int] | None:
        """Send one request (retried after a server restart), check it, emit its ``request``
        event; returns the answer when it was right."""
        bound = self.bound_s(model, len(prompt))
        max_tokens = DISCONNECT_TOKENS if hang_up_fault is not None else MAX_TOKENS
        start_t = self.now()
        started = time.perf_counter()
        outcome, error, answer = "error", None, None
        attempts = 0
        with self._slots[server.label]:
            while attempts < ATTEMPTS:
                attempts += 1
                if not server.ready.is_set():
                    while not server.ready.wait(1):
                        if self.stop.is_set():
                            break
                    if not server.ready.is_set():
                        error = "server not ready when the run ended"
                        break
                incarnation = server.incarnation
                try:
                    answer = stream(
                        self._clients[server.label],
                        prompt,
                        max_tokens,
                        hang_up=hang_up_fault is not None,
                    )
                    error = None
                    break
                except Exception as exc:  # the client's errors and httpx's mid-stream ones
                    error = f"{type(exc).__name__}: {str(exc)[:300]}"
                    # A server killed or restarting under the request: retry once it is back.
                    if server.ready.is_set() and server.incarnation == incarnation:
                        time.sleep(0.5)
                        if server.ready.is_set() and server.incarnation == incarnation:
                            break
        latency = time.perf_counter() - started
        end_t = self.now()  # the oracle's own time below is not the request's
        faults = self.active_faults(self.resources(server), start_t, end_t)
        right = None
        if answer is not None:
            if answer.disconnected:
                outcome = "disconnected"
            elif answer.cached_tokens is None:
                outcome, error = "error", "no cached_tokens in the usage"
            else:
                try:
                    expected = self.oracles[model.name].expected(
                        prompt, answer.cached_tokens, max_tokens
                    )
                except Exception as exc:
                    outcome, error = "error", f"oracle: {exc!r}"[:300]
                else:
                    if tuple(answer.token_ids) == expected:
                        outcome, right = "ok", list(answer.token_ids)
                    else:
                        outcome = "wrong"
                        error = (
                            f"got {answer.token_ids} want {list(expected)} resuming from "
                            f"{answer.cached_tokens} cached tokens"
                        )
                if answer.cached_tokens == 0 and answer.ttft_s is not None and not faults:
                    self._cold_seen[(model.name, len(prompt) // 256)].append(answer.ttft_s)
        if hang_up_fault is not None and hang_up_fault not in faults:
            faults.append(hang_up_fault)
        self.requests += 1
        self.emit(
            "request",
            t=start_t,
            server=server.label,
            model=model.name,
            session=session.id if session else f"disconnect-{hang_up_fault}",
            turn=session.turn if session else 1,
            prompt_tokens=len(prompt),
            cached_tokens=answer.cached_tokens if answer else None,
            ttft_s=round(answer.ttft_s, 4) if answer and answer.ttft_s is not None else None,
            latency_s=round(latency, 4),
            bound_s=round(bound, 4),
            outcome=outcome,
            error=error,
            faults=faults,
            attempts=attempts,
        )
        return right


def disconnector(load: Load, prompts: dict[str, Prompts]) -> Callable[..., None]:
    """The ``client_disconnect`` fault: a fresh session's opening, hung up after one token."""

    def hang_up(server: Served, rng: random.Random, fault: Any) -> None:
        model = server.spec.model
        with contextlib.suppress(Exception):
            load.request(server, model, prompts[model.name].opening(rng), None, rng, fault.id)
        fault.detail = "closed the stream after the first token"

    return hang_up
