"""`kvtier ls / du / verify / gc` on a disk folder written by a real engine (issue #12).

One kvtier engine (the *writer*) stores prompts into a folder and is closed; the commands run
as real subprocesses (``python -m kvtier.cli ... --json``) and are checked against what lies
in the folder (record files read independently, not through the commands' code). Then:

* a clean folder: ``ls``, ``ls NAMESPACE``, ``du`` and ``verify`` agree with the files;
* a damaged one: a known set of record files is damaged (payload bytes flipped, one file
  truncated, one header damaged); ``verify`` reports exactly those, ``--fix`` quarantines
  exactly those, the next ``verify`` is clean, and a second engine (the *reader*) serves every
  prompt: the damaged blocks and what follows them are recomputed, the rest restored, outputs
  equal the resume oracle;
* a live one: while the reader serves in a loop on a background thread, ``verify`` and ``gc
  --to`` / ``--older-than`` / ``--namespace`` run beside it; every output equals the resume
  oracle for the tokens it had cached, ``gc`` shrinks the folder as asked, the engine's log
  has no error.

Record positions (which record is a prompt's n-th block) are learnt while writing: the writer
serves each prompt one block longer at a time and sees which file each step adds.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from kvtier.bench.harness import EngineConfig, GenerateResult, ProcessEngine
from kvtier.bench.harness.engine import SRC_DIR
from kvtier.format import HEADER_BYTES
from kvtier.store.disk import layout
from kvtier.store.disk.index import charge
from kvtier.store.disk.root import index_files_bytes
from kvtier.units import format_size
from tests.support.engine import (
    BLOCK_TOKENS,
    DISK_CAP_BYTES,
    FULL_BLOCK_TOKENS,
    MAX_TOKENS,
    PROMPT_LEN,
    Oracle,
    charged_usage,
    folders_usage,
    kvtier_engine,
    namespace_dir,
    quarantined,
    record_files,
    unique_engine_id,
    until_offloaded,
)
from tests.support.models import TINY_LLAMA_CONFIG
from tests.support.prompts import random_prompt

pytestmark = [pytest.mark.engine, pytest.mark.timeout(900)]

BLOCKS = FULL_BLOCK_TOKENS // BLOCK_TOKENS  # 7 records per 1000-token prompt
#: Prompts the writer stores, and those whose block positions it learns (damaged later).
PROMPTS = 6
POSITIONED = 4
#: (prompt, block position, damage) of the damaged test; the first damaged block of a prompt
#: bounds what the reader can restore of it.
DAMAGE = [
    (0, 3, "payload"),
    (1, 0, "truncate"),
    (2, 5, "header"),
    (3, 2, "payload"),
    (3, 6, "payload"),
]
#: The reason verify gives for each damage (kvtier.format.record).
REASONS = {"payload": "checksum", "truncate": "length", "header": "header_checksum"}
ERROR_LINE = re.compile(r"\b(ERROR|CRITICAL)\b|Traceback")
DISK_TOKENS = "vllm:prompt_tokens_cached_by_source{source=disk}"


# -- the commands, as an operator runs them -------------------------------------------------


@dataclass
class Ran:
    """One finished ``kvtier`` command."""

    args: list[str]
    code: int
    stdout: str
    stderr: str
    started: float
    ended: float

    @property
    def data(self) -> Any:
        return json.loads(self.stdout)


def kvtier(*args: object) -> Ran:
    """``python -m kvtier.cli ARGS`` in a subprocess (this tree's kvtier), timed."""
    argv = [str(a) for a in args]
    path = os.pathsep.join(p for p in (str(SRC_DIR), os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, PYTHONPATH=path)
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "kvtier.cli", *argv],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    ran = Ran(argv, done.returncode, done.stdout, done.stderr, started, time.monotonic())
    assert "Traceback" not in ran.stderr, ran.stderr
    return ran


def together(*commands: tuple[object, ...]) -> list[Ran]:
    """Run the commands at the same time; their results in order."""
    with ThreadPoolExecutor(len(commands)) as pool:
        return list(pool.map(lambda args: kvtier(*args), commands))


# -- ground truth, read from the folder itself ---------------------------------------------


@dataclass(frozen=True)
class Record:
    """A record file as it lies in the namespace folder."""

    #: Path relative to the namespace folder (``blocks/<kk>/<key>.<id>.kvb``).
    name: str
    key: str
    record_id: int
    file_bytes: int


def records_on_disk(ns_dir: Path) -> dict[str, Record]:
    """key hex -> the record file holding it, parsed from the file names."""
    found = {}
    for path in record_files(ns_dir):
        name = str(path.relative_to(ns_dir))
        parsed = layout.parse_record_name(name)
        assert parsed is not None, name
        key, record_id = parsed
        assert key.hex() not in found, f"two records of one key: {name}"
        found[key.hex()] = Record(name, key.hex(), record_id, path.stat().st_size)
    return found


def log_problems(engine: ProcessEngine, since: int) -> list[str]:
    """ERROR / CRITICAL / Traceback lines of the engine's log past byte ``since`` (taken after
    start-up: vLLM logs its failed chat-template warm-up, no tokenizer here, with a traceback)."""
    with open(engine.log_path, "rb") as f:
        f.seek(since)
        text = f.read().decode(errors="replace")
    return [line for line in text.splitlines() if ERROR_LINE.search(line)]


def log_size(engine: ProcessEngine) -> int:
    return engine.log_path.stat().st_size


def metric_sum(metrics: dict[str, float], prefix: str) -> float:
    return sum(v for k, v in metrics.items() if k.startswith(prefix))


def engine_config(model: Path, disk_dir: Path, name: str) -> EngineConfig:
    """The fault tests' small kvtier engine (every hit restored), in one process."""
    config = kvtier_engine(model, disk_dir, unique_engine_id(name))
    config.in_process = True  # one process: starts in about half the time
    return config


# -- the folder the writer leaves ------------------------------------------------------------


@dataclass
class Written:
    """The writer's folder and what it put there."""

    disk_dir: Path
    ns_dir: Path
    prompts: list[list[int]]
    #: prompt index -> key hex of each of its records, in block order (positioned prompts).
    positions: dict[int, list[str]]
    #: prompt index -> key hexes of its records.
    keys: dict[int, set[str]]
    records: dict[str, Record]
    started_ns: int
    ended_ns: int


@pytest.fixture(scope="module")
def oracle(plain_engine: ProcessEngine) -> Oracle:
    return Oracle(plain_engine)


@pytest.fixture(scope="module")
def written(start_engine, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Written:
    disk_dir = tmp_path_factory.mktemp("ops-engine") / "disk"
    started_ns = time.time_ns()
    writer = start_engine(engine_config(tiny_model, disk_dir, "ops-writer"), "ops-writer")
    since = log_size(writer)  # start-up logs a traceback of vLLM's chat-template warm-up
    prompts = [random_prompt(12_000 + i, PROMPT_LEN) for i in range(PROMPTS)]
    positions: dict[int, list[str]] = {}
    keys: dict[int, set[str]] = {}
    ns_dir: Path | None = None
    for i, prompt in enumerate(prompts):
        before = set() if ns_dir is None else set(records_on_disk(ns_dir))
        if i < POSITIONED:
            order = []
            for n in range(1, BLOCKS + 1):  # n full blocks and a few tokens: one more record
                writer.generate_one(prompt[: n * BLOCK_TOKENS + 8], 1)
                assert writer.reset_prefix_cache(reset_connector=True)  # stores are done
                ns_dir = ns_dir or namespace_dir(disk_dir, tiny_model)
                (added,) = set(records_on_disk(ns_dir)) - before - set(order)
                order.append(added)
            positions[i] = order
        else:
            writer.generate_one(prompt, MAX_TOKENS)
            assert writer.reset_prefix_cache(reset_connector=True)
            ns_dir = ns_dir or namespace_dir(disk_dir, tiny_model)
        keys[i] = set(records_on_disk(ns_dir)) - before
        assert len(keys[i]) == BLOCKS, f"prompt {i} stored {len(keys[i])} records"
    assert log_problems(writer, since) == []
    assert writer.close() == 0
    assert ns_dir is not None
    return Written(
        disk_dir,
        ns_dir,
        prompts,
        positions,
        keys,
        records_on_disk(ns_dir),
        started_ns,
        time.time_ns(),
    )


@pytest.fixture(scope="module")
def reader(written: Written, start_engine, tiny_model: Path) -> ProcessEngine:
    """The second engine on the writer's folder (started by the damaged test, after --fix)."""
    return start_engine(engine_config(tiny_model, written.disk_dir, "ops-reader"), "ops-reader")


# -- clean folder ----------------------------------------------------------------------------


def test_commands_on_a_clean_engine_folder_agree_with_its_files(
    written: Written, tiny_model: Path
) -> None:
    root, ns = written.disk_dir, written.ns_dir.name
    records = written.records
    assert len(records) == PROMPTS * BLOCKS
    record_charge = sum(charge(r.file_bytes) for r in records.values())

    listed = kvtier("ls", root, "--json")
    assert listed.code == 0, listed.stderr
    (row,) = listed.data["namespaces"]  # the engine's one namespace
    config = TINY_LLAMA_CONFIG
    assert row["namespace"] == ns
    assert row["model"] == str(tiny_model)
    assert row["layout"] == (
        f"float32 {config['num_hidden_layers']}x{config['num_key_value_heads']}x"
        f"{config['head_dim']} {BLOCK_TOKENS} tok/block"
    )
    assert row["blocks"] == len(records)
    assert row["bytes"] == record_charge
    assert written.started_ns <= row["oldest_use_ns"] <= row["newest_use_ns"] <= written.ended_ns
    assert row["quarantine_bytes"] == 0

    blocks = kvtier("ls", root, ns, "--json")
    assert blocks.code == 0, blocks.stderr
    got = {b["key"]: b for b in blocks.data["blocks"]}
    assert set(got) == set(records)
    for key, record in records.items():
        assert got[key]["record_id"] == record.record_id
        assert got[key]["payload_bytes"] == record.file_bytes - HEADER_BYTES
    uses = [b["last_use_ns"] for b in blocks.data["blocks"]]
    assert uses == sorted(uses, reverse=True), "newest first"
    # The last prompt's records were stored last, and nothing was read since.
    assert {b["key"] for b in blocks.data["blocks"][:BLOCKS]} == written.keys[PROMPTS - 1]

    usage = kvtier("du", root, "--json")
    assert usage.code == 0, usage.stderr
    report = usage.data
    assert [(n["namespace"], n["blocks"], n["bytes"]) for n in report["namespaces"]] == [
        (ns, len(records), record_charge)
    ]
    assert report["capacity_bytes"] == DISK_CAP_BYTES
    assert report["used_bytes"] == record_charge == charged_usage(root)
    assert report["trash_bytes"] == 0 and report["quarantine_entries"] == 0
    assert report["footprint_bytes"] == (
        record_charge + index_files_bytes(root, 1) + folders_usage(root)
    )
    assert report["footprint_bytes"] <= report["capacity_bytes"]

    checked = kvtier("verify", root, "--json")
    assert checked.code == 0, checked.stdout + checked.stderr
    assert checked.data["problems"] == 0
    assert checked.data["namespaces"] == {ns: []}
    assert checked.data["bytes_read"] == record_charge
    text = kvtier("verify", root)
    assert text.code == 0
    assert text.stdout.splitlines() == [
        f"1 namespaces, {format_size(record_charge)} read, 0 problems"
    ]
    (line,) = kvtier("ls", root).stdout.splitlines()
    assert line.startswith(f"{ns}  {tiny_model}  ") and f"  {len(records)} blocks  " in line
    assert records_on_disk(written.ns_dir) == records, "ls, du and verify change nothing"


# -- damaged folder --------------------------------------------------------------------------


def damage(path: Path, how: str) -> None:
    """Damage a record file in place: flip a payload byte, cut the payload short, or flip a
    byte of the header's namespace field."""
    if how == "truncate":
        os.truncate(path, HEADER_BYTES + 100)
        return
    offset = HEADER_BYTES + 1000 if how == "payload" else 20
    with open(path, "r+b") as f:
        f.seek(offset)
        byte = f.read(1)
        f.seek(offset)
        f.write(bytes([byte[0] ^ 0xFF]))


def expected_cached(prompt: int, damaged: dict[str, str], written: Written) -> int:
    """Tokens the reader can restore of ``prompt``: its blocks before the first damaged one."""
    order = written.positions.get(prompt)
    if order is None:
        return FULL_BLOCK_TOKENS
    first = next((n for n, key in enumerate(order) if key in damaged), BLOCKS)
    return first * BLOCK_TOKENS


def test_damaged_records_are_found_quarantined_and_the_rest_served(
    written: Written, oracle: Oracle, request: pytest.FixtureRequest
) -> None:
    root, ns_dir = written.disk_dir, written.ns_dir
    ns = ns_dir.name
    damaged = {written.positions[p][n]: how for p, n, how in DAMAGE}  # key hex -> damage
    for key, how in damaged.items():
        damage(ns_dir / written.records[key].name, how)
    intact = records_on_disk(ns_dir)

    found = kvtier("verify", root, "--json")
    assert found.code == 1, found.stdout + found.stderr
    problems = found.data["namespaces"][ns]
    assert found.data["problems"] == len(problems) == len(damaged)
    assert {p["key"]: p["path"] for p in problems} == {
        key: written.records[key].name for key in damaged
    }
    for p in problems:
        assert p["kind"] == "corrupt" and not p["fixed"]
        assert p["detail"].startswith(REASONS[damaged[p["key"]]] + ":"), p
    assert records_on_disk(ns_dir) == intact and quarantined(ns_dir) == set(), "no fix asked"

    fixed = kvtier("verify", root, "--fix", "--json")
    assert fixed.code == 1, fixed.stdout + fixed.stderr  # problems found (and fixed)
    assert {(p["key"], p["fixed"]) for p in fixed.data["namespaces"][ns]} == {
        (key, True) for key in damaged
    }
    entries = quarantined(ns_dir)
    assert {name.split(".")[0] for name in entries} == set(damaged)
    assert sorted(name.split(".")[2] for name in entries) == sorted(
        REASONS[how] for how in damaged.values()
    )
    left = records_on_disk(ns_dir)
    assert set(left) == set(written.records) - set(damaged)
    assert all(left[k] == written.records[k] for k in left), "intact records untouched"

    again = kvtier("verify", root, "--json")
    assert again.code == 0 and again.data["problems"] == 0, again.stdout
    blocks = kvtier("ls", root, ns, "--json").data["blocks"]
    assert {b["key"] for b in blocks} == set(left)
    usage = kvtier("du", root, "--json").data
    assert usage["quarantine_entries"] == len(damaged)
    assert usage["used_bytes"] == charged_usage(root)

    # The next engine on the folder: restores every block up to a prompt's first damaged one.
    reader: ProcessEngine = request.getfixturevalue("reader")
    since = log_size(reader)
    before = reader.metrics()
    want = [expected_cached(i, damaged, written) for i in range(PROMPTS)]
    got = []
    for prompt in written.prompts:
        result, _ = reader.generate_one(prompt, MAX_TOKENS)
        oracle.check(prompt, result)
        got.append(result.num_cached_tokens)
    assert got == want
    after = reader.metrics()
    assert after[DISK_TOKENS] - before.get(DISK_TOKENS, 0) == sum(want), "all from the disk"
    assert metric_sum(after, "kvtier:tier_load_failures") == 0, "no damaged record was read"
    assert quarantined(ns_dir) == entries

    # Its recomputes stored the damaged blocks again: all of every prompt is restored now.
    until_offloaded(reader, lambda: len(records_on_disk(ns_dir)) >= PROMPTS * BLOCKS)
    assert reader.reset_prefix_cache(reset_connector=True)
    for prompt in written.prompts:
        result, _ = reader.generate_one(prompt, MAX_TOKENS)
        assert result.num_cached_tokens == FULL_BLOCK_TOKENS
        oracle.check(prompt, result)
    assert reader.reset_prefix_cache(reset_connector=True)
    assert len(records_on_disk(ns_dir)) == PROMPTS * BLOCKS

    emptied = kvtier("gc", root, "--quarantine", "--json")  # beside the running engine
    assert emptied.code == 0 and emptied.data["quarantine_entries"] == len(damaged)
    usage = kvtier("du", root, "--json").data
    assert usage["quarantine_entries"] == 0 and quarantined(ns_dir) == set()
    assert usage["used_bytes"] == charged_usage(root)
    assert log_problems(reader, since) == []


# -- live folder -----------------------------------------------------------------------------


@dataclass
class Served:
    prompt: list[int]
    result: GenerateResult
    started: float
    ended: float
    phase: str


@dataclass
class Server:
    """Serves prompts round-robin on a thread, each from the disk tier: the engine cache and
    the host pool are emptied after every request. The only user of the engine while on."""

    engine: ProcessEngine
    prompts: list[list[int]]
    phase: str = "a"
    served: list[Served] = field(default_factory=list)
    error: BaseException | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="ops-server", daemon=True)
        self._thread.start()

    def switch(self, prompts: list[list[int]], phase: str) -> None:
        self.prompts, self.phase = prompts, phase

    def _run(self) -> None:
        turn = 0
        try:
            while not self._stop.is_set():
                prompts, phase = self.prompts, self.phase
                prompt = prompts[turn % len(prompts)]
                turn += 1
                started = time.monotonic()
                result, _ = self.engine.generate_one(prompt, MAX_TOKENS)
                self.served.append(Served(prompt, result, started, time.monotonic(), phase))
                assert self.engine.reset_prefix_cache(reset_connector=True)
        except BaseException as exc:  # re-raised by stop()
            self.error = exc

    def wait_for(self, more: int, timeout_s: float = 300) -> None:
        """Until ``more`` requests beyond those served now have been answered."""
        target = len(self.served) + more
        deadline = time.monotonic() + timeout_s
        while len(self.served) < target:
            assert self.error is None and time.monotonic() < deadline, self.error
            time.sleep(0.05)

    def overlapping(self, ran: Ran) -> int:
        """Requests that were being served while ``ran`` ran."""
        return sum(1 for s in self.served if s.started < ran.ended and s.ended > ran.started)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(300)
        if self.error is not None:
            raise self.error


#: Between the last read of the older records and the first store of the live ones, so
#: ``--older-than`` can cut between them (the command starts within GAP_S - 1 s).
GAP_S = 5.0


def test_verify_and_gc_beside_a_serving_engine(
    written: Written, reader: ProcessEngine, oracle: Oracle
) -> None:
    root, ns_dir = written.disk_dir, written.ns_dir
    ns = ns_dir.name
    since = log_size(reader)
    quarantine_before = quarantined(ns_dir)
    assert reader.reset_prefix_cache(reset_connector=True)
    mark = time.time()
    time.sleep(GAP_S)
    live = [random_prompt(12_100 + i, PROMPT_LEN) for i in range(3)]
    before = set(records_on_disk(ns_dir))
    for prompt in live:
        reader.generate_one(prompt, MAX_TOKENS)
    assert reader.reset_prefix_cache(reset_connector=True)
    live_keys = set(records_on_disk(ns_dir)) - before
    assert len(live_keys) == len(live) * BLOCKS
    older = set(records_on_disk(ns_dir)) - live_keys
    assert older, "the writer's records are still there"
    one = charge(written.records[next(iter(older))].file_bytes)  # every record: one block

    server = Server(reader, live)
    server.start()
    ran: list[Ran] = []
    try:
        # Phase a: the engine restores the live prompts only; the commands race its reads.
        server.wait_for(1)
        checked = kvtier("verify", root, "--json")
        ran.append(checked)
        assert checked.code == 0 and checked.data["problems"] == 0, checked.stdout
        start = kvtier("du", root, "--json").data
        target = start["footprint_bytes"] - 10 * one
        shrunk = kvtier("gc", root, "--to", target, "--json")
        ran.append(shrunk)
        assert shrunk.code == 0, shrunk.stderr
        # gc measures the index files itself: they may differ from du's by a WAL page or two.
        assert shrunk.data["records"] in (9, 10, 11), shrunk.data
        assert shrunk.data["record_bytes"] == shrunk.data["records"] * one
        usage = kvtier("du", root, "--json").data
        assert usage["footprint_bytes"] <= target, (usage, target)
        assert usage["namespaces"][0]["blocks"] == len(older | live_keys) - shrunk.data["records"]
        kept = {b["key"] for b in kvtier("ls", root, ns, "--json").data["blocks"]}
        assert live_keys <= kept, "least recently used first: the live prompts' stay"

        aged = kvtier("gc", root, "--older-than", f"{time.time() - mark - 1.0:.1f}s", "--json")
        ran.append(aged)
        assert aged.code == 0, aged.stderr
        assert aged.data["records"] == len(older) - shrunk.data["records"]
        assert {b["key"] for b in kvtier("ls", root, ns, "--json").data["blocks"]} == live_keys
        server.wait_for(2)

        # Phase b: every prompt; the older ones are recomputed and stored again meanwhile.
        server.switch(live + written.prompts, "b")
        server.wait_for(2)
        writing = kvtier("verify", root, "--json")
        ran.append(writing)
        assert writing.code == 0 and writing.data["problems"] == 0, writing.stdout
        # Both at once as well: the check must not take the collection's evictions in
        # flight for a dead writer's leftovers.
        emptied, beside = together(
            ("gc", root, "--namespace", ns, "--json"), ("verify", root, "--json")
        )
        ran += [emptied, beside]
        assert emptied.code == 0 and emptied.data["records"] >= len(live_keys), emptied.data
        assert beside.code == 0 and beside.data["problems"] == 0, beside.stdout
        after = kvtier("verify", root, "--json")
        ran.append(after)
        assert after.code == 0 and after.data["problems"] == 0, after.stdout
        server.wait_for(len(server.prompts))
    finally:
        server.stop()
    for command in ran:
        assert server.overlapping(command) >= 1, f"nothing served during {command.args}"

    for served in server.served:
        oracle.check(served.prompt, served.result)
    phase_a = [s.result.num_cached_tokens for s in server.served if s.phase == "a"]
    assert phase_a and set(phase_a) == {FULL_BLOCK_TOKENS}, "gc never took a live block"

    assert reader.reset_prefix_cache(reset_connector=True)  # stores done
    final = kvtier("verify", root, "--json")
    assert final.code == 0 and final.data["problems"] == 0, final.stdout
    usage = kvtier("du", root, "--json").data
    assert usage["used_bytes"] == charged_usage(root) and usage["trash_bytes"] == 0
    assert usage["footprint_bytes"] <= usage["capacity_bytes"]
    assert quarantined(ns_dir) == quarantine_before, "an eviction is never a corruption"
    # The engine's view followed gc: every prompt is stored again and then restored whole.
    for prompt in live + written.prompts:
        reader.generate_one(prompt, MAX_TOKENS)
    assert reader.reset_prefix_cache(reset_connector=True)
    for prompt in live + written.prompts:
        result, _ = reader.generate_one(prompt, MAX_TOKENS)
        assert result.num_cached_tokens == FULL_BLOCK_TOKENS
        oracle.check(prompt, result)
    assert log_problems(reader, since) == []
