"""An OpenAI-compatible server on loopback, in-process, for the workload driver's tests.

It speaks just enough HTTP/1.1 (keep-alive, chunked server-sent events) for httpx, and keeps
its own ground truth: every request it received (when, what prompt), a block prefix cache over
whitespace-separated words (a "token" is a word; a block is ``BLOCK`` of them), and the
Prometheus counters a vLLM server exposes for where prompt tokens came from. Tests compare the
driver's figures with that ground truth.

Behaviour a test can set: the time to first token (a base plus a cost per uncached token), the
gap between streamed tokens, requests that fail with HTTP 500, and a restart (``restart``:
the cache and counters start again from zero and ``/health`` answers 503 for ``down_s``).

The server runs its own event loop on a daemon thread, so the driver can run under
``asyncio.run`` or Typer's ``CliRunner`` beside it; ``close`` stops it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import threading
import time
from dataclasses import dataclass, field

BLOCK = 4  # words per cache block
MODEL = "fake-model"


@dataclass
class Received:
    """One completion request as the server saw it."""

    at: float  # time.monotonic() when its body was read
    path: str
    body: dict
    words: list[str]
    cached: int
    status: int = 200
    answer: str = ""
    done_at: float = 0.0  # time.monotonic() when its last byte was written


@dataclass
class Settings:
    ttft_base_s: float = 0.002
    ttft_per_uncached_s: float = 0.0
    itl_s: float = 0.001
    fail_indices: set[int] = field(default_factory=set)  # 0-based request numbers that get 500
    block_size: int = BLOCK
    pool_blocks: int = 64  # what /metrics says the engine's KV cache holds


def prompt_words(path: str, body: dict) -> list[str]:
    if path.endswith("/chat/completions"):
        text = "".join(f" {m['role']}: {m['content']}" for m in body["messages"])
    else:
        text = body["prompt"]
    return text.split()


def answer_words(words: list[str], count: int) -> list[str]:
    """A deterministic answer: it names a digest of its prompt, so a later prompt that carries
    it proves which answer the history holds."""
    digest = hashlib.sha256(" ".join(words).encode()).hexdigest()[:8]
    return [f"ans-{digest}-{i}" for i in range(count)]


class FakeOpenAIServer:
    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = settings or Settings()
        self.received: list[Received] = []
        self.restarts: list[float] = []  # time.monotonic() of each restart
        self.requests_before_restart: list[int] = []
        self._blocks: set[str] = set()
        self._counters = {"local_compute": 0, "local_cache_hit": 0}
        self._down_until = 0.0
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the fake server did not start")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # -- what tests read and set ------------------------------------------------------------

    def counters(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counters)

    def restart(self, down_s: float = 0.0) -> None:
        """What a server restart does to a cache and its counters: both start from zero."""
        with self._lock:
            self._blocks.clear()
            self._counters = dict.fromkeys(self._counters, 0)
            self._down_until = time.monotonic() + down_s
            self.restarts.append(time.monotonic())
            self.requests_before_restart.append(len(self.received))

    def close(self) -> None:
        """Stop serving: open connections are cancelled, then the loop stops and closes."""

        async def shutdown() -> None:
            self._server.close()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    # -- the server -------------------------------------------------------------------------

    def _serve(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._connection, "127.0.0.1", 0)
        )
        self.port = self._server.sockets[0].getsockname()[1]
        self._ready.set()
        self._loop.run_forever()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                line = await reader.readline()
                if not line:
                    break
                method, path, _ = line.decode().split(" ", 2)
                headers = {}
                while (header := await reader.readline()) not in (b"\r\n", b"\n", b""):
                    name, _, value = header.decode().partition(":")
                    headers[name.strip().lower()] = value.strip()
                length = int(headers.get("content-length", 0))
                body = json.loads(await reader.readexactly(length)) if length else {}
                await self._route(method, path.split("?")[0], body, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    async def _send(self, writer: asyncio.StreamWriter, status: int, ctype: str, text: str) -> None:
        data = text.encode()
        head = f"HTTP/1.1 {status} X\r\nContent-Type: {ctype}\r\nContent-Length: {len(data)}"
        writer.write(head.encode() + b"\r\n\r\n" + data)
        await writer.drain()

    async def _route(
        self, method: str, path: str, body: dict, writer: asyncio.StreamWriter
    ) -> None:
        if path == "/health":
            up = time.monotonic() >= self._down_until
            await self._send(writer, 200 if up else 503, "text/plain", "")
        elif path == "/v1/models":
            await self._send(writer, 200, "application/json", json.dumps({"data": [{"id": MODEL}]}))
        elif path == "/metrics":
            await self._send(writer, 200, "text/plain", self._metrics())
        elif method == "POST" and path == "/fake/restart":  # a restart command's way in
            self.restart(float(body.get("down_s", 0.0)))
            await self._send(writer, 200, "application/json", "{}")
        elif method == "POST" and path in ("/v1/chat/completions", "/v1/completions"):
            await self._complete(path, body, writer)
        else:
            await self._send(writer, 404, "text/plain", "not found")

    def _metrics(self) -> str:
        """The families a vLLM server exposes for these figures, in prometheus_client's own
        text format (as vLLM writes it)."""
        from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

        registry = CollectorRegistry()
        by_source = Counter(
            "vllm:prompt_tokens_by_source", "", ["engine", "source"], registry=registry
        )
        for source, tokens in self.counters().items():
            by_source.labels("0", source).inc(tokens)
        info = Gauge(
            "vllm:cache_config_info", "", ["block_size", "num_gpu_blocks"], registry=registry
        )
        info.labels(str(self.settings.block_size), str(self.settings.pool_blocks)).set(1)
        return generate_latest(registry).decode()

    def _admit(self, path: str, body: dict) -> Received:
        """Count the request against the cache (under the lock: requests interleave)."""
        words = prompt_words(path, body)
        block = self.settings.block_size
        with self._lock:
            number = len(self.received)
            cached = 0
            for end in range(block, len(words) + 1, block):
                if _digest(words[:end]) not in self._blocks:
                    break
                cached = end
            for end in range(block, len(words) + 1, block):
                self._blocks.add(_digest(words[:end]))
            received = Received(time.monotonic(), path, body, words, cached)
            if number in self.settings.fail_indices:
                received.status = 500
            else:
                self._counters["local_compute"] += len(words) - cached
                self._counters["local_cache_hit"] += cached
            self.received.append(received)
        return received

    async def _complete(self, path: str, body: dict, writer: asyncio.StreamWriter) -> None:
        self.in_flight += 1  # only this thread's loop touches these two
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await self._stream(path, body, writer)
        finally:
            self.in_flight -= 1

    async def _stream(self, path: str, body: dict, writer: asyncio.StreamWriter) -> None:
        got = self._admit(path, body)
        if got.status != 200:
            await self._send(writer, 500, "application/json", '{"error": "injected"}')
            return
        s = self.settings
        chat = path.endswith("/chat/completions")
        answer = answer_words(got.words, int(body["max_tokens"]))
        got.answer = " ".join(answer)
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )

        async def event(payload: str) -> None:
            data = f"data: {payload}\n\n".encode()
            writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            await writer.drain()

        if chat:  # vLLM's chat stream opens with the role alone
            await event(json.dumps({"choices": [{"delta": {"role": "assistant", "content": ""}}]}))
        await asyncio.sleep(s.ttft_base_s + s.ttft_per_uncached_s * (len(got.words) - got.cached))
        for i, word in enumerate(answer):
            if i:
                await asyncio.sleep(s.itl_s)
            text = (" " if i else "") + word
            choice = {"delta": {"content": text}} if chat else {"text": text}
            await event(json.dumps({"choices": [choice]}))
        usage = {
            "prompt_tokens": len(got.words),
            "completion_tokens": len(answer),
            "prompt_tokens_details": {"cached_tokens": got.cached},
        }
        await event(json.dumps({"choices": [], "usage": usage}))
        await event("[DONE]")
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        got.done_at = time.monotonic()


def _digest(words: list[str]) -> str:
    return hashlib.sha256("\x00".join(words).encode()).hexdigest()
