"""Send a plan to a server: arrivals, histories, the number in flight, the command between
rounds, and the server's counters around each segment.

Each planned request is a task that waits, in order, for: its segment to start (the second
segment starts once every request of the first is answered, the command has run and the server
answers ``/health`` again); its arrival time; its conversation's previous request (whose answer
its prompt carries); a free slot when ``concurrency`` caps the requests in flight. It then sends
the conversation's history plus its own messages, and, when it extends a conversation, appends
its messages and the answer to that history.

A failed request still extends its conversation, with an empty answer, so later rounds are
sent (and counted) as planned rather than silently dropped.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field

from kvtier.bench.workload import metrics
from kvtier.bench.workload.client import Completion, OpenAIClient
from kvtier.bench.workload.plan import Message, PlannedRequest


@dataclass
class Sent:
    """A planned request and what came back; times in seconds from the run's start."""

    index: int
    unit: int
    round: int
    segment: int
    sent_s: float
    completion: Completion

    def as_dict(self) -> dict[str, object]:
        data = asdict(self)
        data["completion"].pop("text")  # the answers stay out of the raw data (size)
        return data


@dataclass
class Segment:
    """One stretch of the run between commands: its times and counter growth."""

    start_s: float
    end_s: float = 0.0
    counters: dict[str, float] = field(default_factory=dict)  # growth over the segment


@dataclass
class RunRecord:
    sent: list[Sent]
    segments: list[Segment]
    command_s: float | None = None  # the command between rounds and the wait for /health
    pool_tokens: int | None = None  # the engine's own KV cache, when /metrics says


class ServerNotReady(RuntimeError):
    """The server did not answer ``/health`` in time after the command between rounds."""


async def wait_ready(client: OpenAIClient, timeout_s: float, poll_s: float = 0.5) -> None:
    deadline = time.monotonic() + timeout_s
    while not await client.ready():
        if time.monotonic() > deadline:
            raise ServerNotReady(f"{client.url}/health did not answer 200 within {timeout_s:.0f} s")
        await asyncio.sleep(poll_s)


async def run(
    plan: list[PlannedRequest],
    client: OpenAIClient,
    max_tokens: int,
    concurrency: int = 0,
    between_rounds: Callable[[], Awaitable[None]] | None = None,
    ready_timeout_s: float = 600.0,
    progress: Callable[[str], None] = lambda line: None,
) -> RunRecord:
    """Send ``plan`` through ``client`` (``concurrency`` 0: no cap on requests in flight);
    ``between_rounds`` runs where the plan's segment changes (a plan with one segment never
    calls it). Returns every request's outcome and each segment's counter growth."""
    segments_in_plan = sorted({p.segment for p in plan})
    if len(segments_in_plan) > 1 and between_rounds is None:
        raise ValueError("the plan has a restart point but no command to run there")
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    histories: dict[str, list[Message]] = {}
    previous: dict[int, int] = {}  # request index -> the index it follows in its conversation
    last_of: dict[str, int] = {}
    for p in plan:
        if p.conversation is not None:
            if p.conversation in last_of:
                previous[p.index] = last_of[p.conversation]
            last_of[p.conversation] = p.index
    answered = {p.index: asyncio.Event() for p in plan}
    started = {s: asyncio.Event() for s in segments_in_plan}
    segment_start: dict[int, float] = {}
    slots = asyncio.Semaphore(concurrency) if concurrency > 0 else None
    sent: list[Sent] = []
    every = max(1, len(plan) // 10)  # a progress line per tenth of the run
    record = RunRecord(sent=sent, segments=[])

    async def one(p: PlannedRequest) -> None:
        await started[p.segment].wait()
        delay = segment_start[p.segment] + p.arrival_s - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        if p.index in previous:
            await answered[previous[p.index]].wait()
        if slots is not None:
            await slots.acquire()
        try:
            history = histories.get(p.conversation, []) if p.conversation else []
            messages = [*history, *p.messages]
            sent_s = loop.time() - t0
            completion = await client.stream(messages, max_tokens)
        finally:
            if slots is not None:
                slots.release()
        if p.conversation is not None:
            histories[p.conversation] = [*messages, ("assistant", completion.text)]
        sent.append(Sent(p.index, p.unit, p.round, p.segment, sent_s, completion))
        if completion.error:
            progress(f"request {p.index} (unit {p.unit}, round {p.round}): {completion.error}")
        elif len(sent) % every == 0:
            progress(f"{len(sent)} of {len(plan)} answered")
        answered[p.index].set()

    tasks = [asyncio.create_task(one(p)) for p in plan]
    try:
        for n, segment in enumerate(segments_in_plan):
            if n > 0:
                progress("running the command between rounds")
                command_start = loop.time()
                await between_rounds()  # type: ignore[misc]  # checked above
                await wait_ready(client, ready_timeout_s)
                record.command_s = loop.time() - command_start
                progress(f"server ready again after {record.command_s:.1f} s")
            text = await client.get_text("/metrics")
            if record.pool_tokens is None:
                record.pool_tokens = metrics.pool_tokens(text)
            before = metrics.counters(text)
            segment_start[segment] = loop.time()
            record.segments.append(Segment(start_s=segment_start[segment] - t0))
            started[segment].set()
            mine = [tasks[p.index] for p in plan if p.segment == segment]
            await asyncio.gather(*mine)
            record.segments[-1].end_s = loop.time() - t0
            after = metrics.counters(await client.get_text("/metrics"))
            record.segments[-1].counters = metrics.growth(before, after)
            progress(f"segment {n}: {len(mine)} requests answered")
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    sent.sort(key=lambda s: s.index)
    return record
