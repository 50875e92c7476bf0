"""Synthetic soak event logs: a clean run that meets the acceptance, which a test then spoils
in exactly one way (a wrong output, a slow request, a crash, a leak...)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

MIB = 1 << 20
CAP_BYTES = 64 * MIB
#: The runner's long layout: two replicas sharing Redis, each its own folder, and a pair of
#: engines sharing one folder.
FOLDERS = {"disk-rep-a": "/soak/rep-a", "disk-rep-b": "/soak/rep-b", "disk-pair": "/soak/pair"}
SERVERS = [
    {"label": label, "model": "tiny", "role": role, "disk_dir": FOLDERS[folder], "shared": shared}
    for label, role, folder, shared in (
        ("rep-a", "replica", "disk-rep-a", True),
        ("rep-b", "replica", "disk-rep-b", True),
        ("pair-a", "folder-pair", "disk-pair", False),
        ("pair-b", "folder-pair", "disk-pair", False),
    )
]
LABELS = [s["label"] for s in SERVERS]


@dataclass
class Run:
    """A run of ``duration_s`` with a sample every ``every_s`` and a request per server every
    ``every_s`` (TTFT 0.1 s, bound 1 s), flat resources, no faults, a clean shutdown."""

    duration_s: float = 1800.0
    warmup_s: float = 120.0
    every_s: float = 5.0
    events: list[dict] = field(default_factory=list)
    #: Per process label (the servers' and ``redis``): pid, fds, threads and rss_bytes as
    #: functions of t (for leaks and restarts).
    fds: dict = field(default_factory=dict)
    threads: dict = field(default_factory=dict)
    rss: dict = field(default_factory=dict)
    pids: dict = field(default_factory=dict)
    #: Per process label, its RSS by role as a function of t ({role: rss_bytes}); a label
    #: without one is sampled without ``by_role``, as older logs were.
    rss_by_role: dict = field(default_factory=dict)
    #: Labels sampled besides the servers and ``redis`` (a plain vLLM reference, say).
    other_labels: list[str] = field(default_factory=list)
    #: du of the pair's folder (the replicas' stay at 8 MiB).
    du_bytes: int = 32 * MIB
    after_shutdown: dict = field(
        default_factory=lambda: {"shm_regions": 0, "temp_files": 0, "servers_alive": 0}
    )

    def __post_init__(self) -> None:
        self.events.append(
            {
                "type": "run",
                "t": 0.0,
                "seed": 7,
                "duration_s": self.duration_s,
                "warmup_s": self.warmup_s,
                "command": "python -m benchmarks soak",
                "started": "2026-12-02T04:00:00Z",
                "git_rev": "abc",
                "machine": "test",
                "servers": SERVERS,
                "folders": [
                    {"label": label, "path": path, "cap_bytes": CAP_BYTES}
                    for label, path in FOLDERS.items()
                ],
            }
        )

    def request(self, t: float, server: str = "pair-a", **fields: object) -> None:
        event = {
            "type": "request",
            "t": t,
            "server": server,
            "model": "m",
            "session": "s1",
            "turn": 1,
            "prompt_tokens": 512,
            "cached_tokens": 256,
            "ttft_s": 0.1,
            "latency_s": 0.3,
            "bound_s": 1.0,
            "outcome": "ok",
            "error": None,
            "faults": [],
        }
        event.update(fields)
        self.events.append(event)

    def fault(
        self,
        fid: int,
        t: float,
        kind: str,
        target: str,
        end_t: float | None = None,
        injected_kill: bool = False,
    ) -> None:
        self.events.append(
            {
                "type": "fault",
                "id": fid,
                "t": t,
                "end_t": t + 5 if end_t is None else end_t,
                "kind": kind,
                "target": target,
                "detail": "",
                "injected_kill": injected_kill,
            }
        )

    def crash(self, t: float, server: str, injected: bool, returncode: int = -9) -> None:
        self.events.append(
            {
                "type": "crash",
                "t": t,
                "server": server,
                "returncode": returncode,
                "injected": injected,
                "log_tail": "x",
            }
        )

    def _by_role(self, label: str, t: float) -> dict:
        if label not in self.rss_by_role:
            return {}
        roles = self.rss_by_role[label](t)
        return {
            "by_role": {
                role: {"count": 1, "fds": 20, "threads": 15, "rss_bytes": rss_bytes}
                for role, rss_bytes in roles.items()
            }
        }

    def write(self, path: Path) -> Path:
        t = 0.0
        requests = 0
        body = []
        while t <= self.duration_s:
            for label in LABELS:
                body.append(
                    {
                        "type": "request",
                        "t": t + 0.5,
                        "server": label,
                        "model": "m",
                        "session": f"s{int(t)}",
                        "turn": 1,
                        "prompt_tokens": 512,
                        "cached_tokens": 0,
                        "ttft_s": 0.1,
                        "latency_s": 0.3,
                        "bound_s": 1.0,
                        "outcome": "ok",
                        "error": None,
                        "faults": [],
                    }
                )
                requests += 1
            body.append(
                {
                    "type": "sample",
                    "t": t,
                    "processes": {
                        label: {
                            "pid": self.pids.get(label, lambda _t, i=i: 1000 + i)(t),
                            "fds": self.fds.get(label, lambda _t: 40)(t),
                            "threads": self.threads.get(label, lambda _t: 30)(t),
                            "rss_bytes": self.rss.get(label, lambda _t: 500 * MIB)(t),
                            **self._by_role(label, t),
                        }
                        for i, label in enumerate([*LABELS, "redis", *self.other_labels])
                    },
                    "folders": {
                        label: {
                            "path": path,
                            "cap_bytes": CAP_BYTES,
                            "files_bytes": du - MIB,
                            "dirs_bytes": MIB,
                            "du_bytes": du,
                        }
                        for label, path in FOLDERS.items()
                        for du in [self.du_bytes if label == "disk-pair" else 8 * MIB]
                    },
                    "shm_regions": 4,
                    "temp_files": 0,
                }
            )
            t += self.every_s
        events = sorted(self.events[1:] + body, key=lambda e: e["t"])
        end = {
            "type": "end",
            "t": self.duration_s + 1,
            "requests": requests,
            "faults": sum(e["type"] == "fault" for e in events),
            "after_shutdown": self.after_shutdown,
        }
        with open(path, "w") as f:
            for event in [self.events[0], *events, end]:
                f.write(json.dumps(event) + "\n")
        return path
