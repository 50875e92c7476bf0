"""One streamed request to an OpenAI-compatible server, timed on arrival of each chunk.

httpx's async client (a dependency of the ``[bench]`` extra; vLLM installs it too). Server-sent
events are read line by line; the time to first token is the time to the first chunk that
carries generated text (vLLM's chat stream opens with a chunk holding only the role), and the
inter-token latencies are the gaps between later text chunks. A chunk usually holds one token;
a server that batches tokens into chunks shows fewer, longer gaps.

A request that fails (refused connection, an HTTP error, a stream cut short) is an outcome
with ``error`` set, never an exception: the run goes on and the results count the failures.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

from kvtier.bench.workload.plan import Message

ENDPOINTS = ("chat", "completions")


@dataclass
class Completion:
    """What one request measured (times in seconds from when it was sent)."""

    ttft_s: float | None = None
    e2e_s: float | None = None
    itl_s: list[float] = field(default_factory=list)  # gaps between text chunks after the first
    text: str = ""
    prompt_tokens: int | None = None  # the server's usage figures, when it sends them
    completion_tokens: int | None = None
    cached_tokens: int | None = None  # vLLM needs --enable-prompt-tokens-details for this
    error: str | None = None


def base_url(url: str) -> str:
    """``http://host:port`` of a URL given with or without ``/v1`` and a trailing slash."""
    url = url.rstrip("/")
    return url[: -len("/v1")] if url.endswith("/v1") else url


def render(messages: list[Message]) -> str:
    """A chat as one plain-text prompt for ``/v1/completions`` (no chat template): every turn
    on its own paragraph, ending where the assistant's answer starts."""
    return "".join(f"{role}: {content}\n\n" for role, content in messages) + "assistant:"


class OpenAIClient:
    """Streams chat or text completions from ``url`` with one shared connection pool."""

    def __init__(
        self,
        url: str,
        model: str | None,
        endpoint: str = "chat",
        ignore_eos: bool = True,
        timeout_s: float = 600.0,
        api_key: str | None = None,
    ) -> None:
        import httpx

        if endpoint not in ENDPOINTS:
            raise ValueError(f"endpoint {endpoint!r}: use one of {', '.join(ENDPOINTS)}")
        self.url = base_url(url)
        self.model = model
        self.endpoint = endpoint
        self.ignore_eos = ignore_eos
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # No pool limit: the runner decides how many requests are in flight.
        self._http = httpx.AsyncClient(
            base_url=self.url,
            headers=headers,
            timeout=httpx.Timeout(timeout_s, connect=30.0),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=None),
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> OpenAIClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def first_model(self) -> str:
        """The first model ``/v1/models`` lists (a server started with one model has one)."""
        response = await self._http.get("/v1/models")
        response.raise_for_status()
        return str(response.json()["data"][0]["id"])

    async def ready(self) -> bool:
        """True when ``/health`` answers 200 (False on any error: the server is not up)."""
        import httpx

        try:
            return (await self._http.get("/health", timeout=5.0)).status_code == 200
        except httpx.HTTPError:
            return False

    async def get_text(self, path: str) -> str | None:
        """The body of ``GET path`` (e.g. ``/metrics``), None when it cannot be read."""
        import httpx

        try:
            response = await self._http.get(path, timeout=30.0)
        except httpx.HTTPError:
            return None
        return response.text if response.status_code == 200 else None

    def _body(self, messages: list[Message], max_tokens: int) -> tuple[str, dict]:
        body: dict = {
            "model": self.model,
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if self.ignore_eos:
            body["ignore_eos"] = True  # vLLM's extension: every answer max_tokens long
        if self.endpoint == "chat":
            body["messages"] = [{"role": role, "content": text} for role, text in messages]
            return "/v1/chat/completions", body
        body["prompt"] = render(messages)
        return "/v1/completions", body

    async def stream(self, messages: list[Message], max_tokens: int) -> Completion:
        """Send one request and read its stream to the end (see the module docstring)."""
        import httpx

        path, body = self._body(messages, max_tokens)
        out = Completion()
        parts: list[str] = []
        start = time.perf_counter()
        last = None
        try:
            async with self._http.stream("POST", path, json=body) as response:
                if response.status_code != 200:
                    detail = (await response.aread()).decode(errors="replace")[:200]
                    out.error = f"HTTP {response.status_code}: {detail}"
                    return out
                async for line in response.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    payload = line[5:].strip()
                    if payload == "[DONE]":
                        break
                    now = time.perf_counter()
                    chunk = json.loads(payload)
                    _read_usage(chunk, out)
                    text = _chunk_text(chunk)
                    if not text:
                        continue
                    if last is None:
                        out.ttft_s = now - start
                    else:
                        out.itl_s.append(now - last)
                    last = now
                    parts.append(text)
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            out.error = f"{type(exc).__name__}: {exc}"[:300]
        out.e2e_s = time.perf_counter() - start
        out.text = "".join(parts)
        if out.error is None and out.ttft_s is None:
            out.error = "the stream ended without generated text"
        return out


def _chunk_text(chunk: dict) -> str:
    choices = chunk.get("choices") or []
    if not choices:
        return ""
    choice = choices[0]
    if "delta" in choice:
        return (choice["delta"] or {}).get("content") or ""
    return choice.get("text") or ""


def _read_usage(chunk: dict, out: Completion) -> None:
    usage = chunk.get("usage")
    if not usage:
        return
    out.prompt_tokens = usage.get("prompt_tokens")
    out.completion_tokens = usage.get("completion_tokens")
    details = usage.get("prompt_tokens_details") or {}
    if details.get("cached_tokens") is not None:
        out.cached_tokens = int(details["cached_tokens"])
