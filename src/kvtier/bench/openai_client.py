"""Minimal client of a vLLM OpenAI-compatible server: streamed completions, metrics, resets."""

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field

from kvtier.bench.harness.engine import metric_key


@dataclass(frozen=True)
class StreamResult:
    ttft_s: float  # request sent -> first generated chunk received
    total_s: float
    text: str
    token_ids: list[int] = field(default_factory=list)
    #: Prompt tokens served from a cache (the server needs ``--enable-prompt-tokens-details``).
    cached_tokens: int | None = None


class ServerClient:
    def __init__(self, base_url: str, model: str, timeout_s: float = 900) -> None:
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.timeout_s = timeout_s

    def _post(self, path: str, body: dict | None = None) -> urllib.request.Request:
        data = json.dumps(body or {}).encode()
        return urllib.request.Request(
            self.base_url + path,
            data=data,
            method="POST",
            headers={"Content-Type": "application/json"},
        )

    def wait_ready(self, timeout_s: float, alive: Callable[[], bool]) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not alive():
                raise RuntimeError("server exited before it was ready")
            try:
                with urllib.request.urlopen(self.base_url + "/health", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(1)
        raise TimeoutError(f"server not ready after {timeout_s:.0f} s")

    def complete_stream(
        self,
        prompt: str | list[int],
        max_tokens: int,
        cache_salt: str | None = None,
        ignore_eos: bool = False,
        kv_transfer_params: dict | None = None,
    ) -> StreamResult:
        """Greedy completion, streamed: client-side TTFT, text, token ids and cached tokens."""
        body: dict = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "ignore_eos": ignore_eos,
            "stream": True,
            "stream_options": {"include_usage": True},
            "return_token_ids": True,
        }
        if cache_salt is not None:
            body["cache_salt"] = cache_salt
        if kv_transfer_params is not None:
            body["kv_transfer_params"] = kv_transfer_params
        start = time.perf_counter()
        ttft = None
        text: list[str] = []
        token_ids: list[int] = []
        cached = None
        with urllib.request.urlopen(
            self._post("/v1/completions", body), timeout=self.timeout_s
        ) as resp:
            for raw in resp:
                line = raw.decode().strip()
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    break
                chunk = json.loads(payload)
                details = (chunk.get("usage") or {}).get("prompt_tokens_details") or {}
                if details.get("cached_tokens") is not None:
                    cached = int(details["cached_tokens"])
                if not chunk.get("choices"):
                    continue  # the usage chunk
                choice = chunk["choices"][0]
                if ttft is None:
                    ttft = time.perf_counter() - start
                text.append(choice.get("text", ""))
                token_ids += choice.get("token_ids") or []
        total = time.perf_counter() - start
        return StreamResult(
            ttft if ttft is not None else total, total, "".join(text), token_ids, cached
        )

    def reset_prefix_cache(self, reset_external: bool = False) -> bool:
        """``POST /reset_prefix_cache`` (the connector's cache too if ``reset_external``); the
        server's ``success``."""
        path = "/reset_prefix_cache" + ("?reset_external=true" if reset_external else "")
        with urllib.request.urlopen(self._post(path), timeout=60) as resp:
            body = resp.read()
        try:
            return bool(json.loads(body).get("success", True))
        except (ValueError, AttributeError):
            return True  # an older server answers without a body

    def metrics(self) -> dict[str, float]:
        """Prometheus samples keyed like every engine driver's metrics (``metric_key``):
        counters under their own name (no ``_total``), ``_created`` samples left out."""
        with urllib.request.urlopen(self.base_url + "/metrics", timeout=30) as resp:
            return parse_metrics(resp.read().decode())


def parse_metrics(text: str) -> dict[str, float]:
    """``{metric_key: value}`` of a Prometheus text exposition (the library's parser,
    ``kvtier.metrics_view.parse``, which ``kvtier stats`` uses too)."""
    from kvtier.metrics_view import parse

    parsed = parse(text)
    return {
        metric_key(name, labels): value
        for name in parsed.names()
        for labels, value in parsed.rows(name)
    }
