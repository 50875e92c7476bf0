"""Minimal client of a vLLM OpenAI-compatible server (stdlib only): TTFT, metrics, resets."""

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class StreamResult:
    ttft_s: float  # request sent -> first generated text received
    total_s: float
    text: str


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

    def complete_stream(self, prompt: str | list[int], max_tokens: int) -> StreamResult:
        body = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0.0,
            "stream": True,
        }
        start = time.perf_counter()
        ttft = None
        text = []
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
                piece = chunk["choices"][0].get("text", "")
                if ttft is None:
                    ttft = time.perf_counter() - start
                text.append(piece)
        total = time.perf_counter() - start
        return StreamResult(ttft if ttft is not None else total, total, "".join(text))

    def reset_prefix_cache(self) -> None:
        with urllib.request.urlopen(self._post("/reset_prefix_cache"), timeout=60) as resp:
            resp.read()

    def metrics(self) -> dict[str, float]:
        """Prometheus samples as ``{"name{label=value,...}": value}`` (model/engine labels cut).

        Keys match ``EngineProcess.metrics()``: counter names without ``_total``.
        """
        with urllib.request.urlopen(self.base_url + "/metrics", timeout=30) as resp:
            text = resp.read().decode()
        samples: dict[str, float] = {}
        for line in text.splitlines():
            if not line or line.startswith("#"):
                continue
            name_labels, _, value = line.rpartition(" ")
            name, _, labels = name_labels.partition("{")
            # The exposition adds ``_total`` to counters; key them by the metric's own name.
            name = name.removesuffix("_total")
            kept = ",".join(
                part
                for part in labels.rstrip("}").split(",")
                if part and not part.startswith(("model_name=", "engine="))
            ).replace('"', "")
            try:
                samples[f"{name}{{{kept}}}"] = float(value)
            except ValueError:
                continue
        return samples
