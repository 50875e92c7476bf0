"""``kvtier bench workload`` against a fake OpenAI-compatible server on loopback: the server
keeps the ground truth (what it received, when, what its cache served), the tests compare the
driver's figures with it."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvtier.bench.workload import plan
from kvtier.bench.workload.drive import Sending, drive
from kvtier.cli.main import app
from tests.support.fake_openai_server import FakeOpenAIServer, Received, Settings

pytestmark = pytest.mark.timeout(120)
runner = CliRunner()


@pytest.fixture
def server() -> Iterator[FakeOpenAIServer]:
    fake = FakeOpenAIServer()
    yield fake
    fake.close()


def run(shape: plan.Shape, fake: FakeOpenAIServer, out: Path, **sending: object) -> dict:
    return asyncio.run(
        drive(shape, Sending(url=fake.url, out=out, **sending), lambda line: None)  # type: ignore[arg-type]
    )


def by_user_round(fake: FakeOpenAIServer) -> dict[tuple[int, int], Received]:
    """The fake's requests keyed by the (user, round) their last question names."""
    out = {}
    for got in fake.received:
        text = " ".join(got.words)
        tag = text[text.rindex("user ") :].split(":")[0].split()  # "user U round R"
        out[(int(tag[1]), int(tag[3]))] = got
    return out


def test_each_round_resends_the_history_with_the_previous_answer(server, tmp_path) -> None:
    shape = plan.Shape("chat", users=3, rounds=3, system_tokens=20, question_tokens=8)
    report = run(shape, server, tmp_path, qps=40.0)
    assert report["summary"]["failed"] == 0
    got = by_user_round(server)
    for u in range(3):
        for r in (1, 2):
            before, now = got[(u, r - 1)], got[(u, r)]
            assert now.words[: len(before.words)] == before.words
            answer = before.answer.split()
            assert now.words[len(before.words) : len(before.words) + 1 + len(answer)] == [
                "assistant:",
                *answer,
            ]
            # Sent only once the answer it carries was complete.
            assert now.at >= before.done_at
    systems = {tuple(got[(u, 0)].words[: got[(u, 0)].words.index("user:")]) for u in range(3)}
    assert len(systems) == 1 and len(next(iter(systems))) > 10  # one shared system prompt


def test_the_completions_endpoint_sends_the_chat_as_plain_text(server, tmp_path) -> None:
    shape = plan.Shape("chat", users=2, rounds=2, system_tokens=12, question_tokens=6)
    result = runner.invoke(
        app,
        [
            "bench", "workload", "--url", server.url + "/v1/", "--endpoint", "completions",
            "--users", "2", "--rounds", "2", "--system-tokens", "12", "--question-tokens", "6",
            "--answer-tokens", "3", "--json", "--out", str(tmp_path),
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    printed = json.loads(result.stdout)
    assert printed["config"]["endpoint"] == "completions"
    assert printed["summary"]["requests"] == 4 and printed["summary"]["failed"] == 0
    assert {r.path for r in server.received} == {"/v1/completions"}
    first, second = by_user_round(server)[(0, 0)], by_user_round(server)[(0, 1)]
    assert first.body["prompt"].startswith("system: system:")
    assert first.body["prompt"].endswith("assistant:")
    assert second.body["prompt"].startswith(first.body["prompt"] + " " + first.answer)
    assert plan.build(shape)[2].messages[0][1] in second.body["prompt"]


def test_requests_wait_for_their_poisson_arrival(server, tmp_path) -> None:
    shape = plan.Shape("no-reuse", users=4, rounds=2, system_tokens=10, question_tokens=5)
    qps = 25.0
    report = run(shape, server, tmp_path, qps=qps)
    start = report["segments"][0]["start_s"]
    planned = {p.index: p.arrival_s for p in plan.build(shape, qps)}
    assert planned[7] > 0.1  # the arrivals spread the run out
    for sent in report["requests"]:
        assert sent["sent_s"] >= start + planned[sent["index"]] - 1e-3


def test_concurrency_caps_the_requests_in_flight(tmp_path) -> None:
    fake = FakeOpenAIServer(Settings(ttft_base_s=0.03))
    try:
        shape = plan.Shape("no-reuse", users=4, rounds=2, system_tokens=10, question_tokens=5)
        report = run(shape, fake, tmp_path, concurrency=2)
    finally:
        fake.close()
    assert report["summary"]["requests"] == 8
    assert fake.max_in_flight == 2


def test_latencies_are_measured_from_the_stream(tmp_path) -> None:
    fake = FakeOpenAIServer(Settings(ttft_base_s=0.05, itl_s=0.02))
    try:
        shape = plan.Shape("no-reuse", users=2, rounds=1, answer_tokens=4, system_tokens=10)
        summary = run(shape, fake, tmp_path)["summary"]
    finally:
        fake.close()
    assert 0.05 <= summary["ttft_s"]["p50"] < 1.0
    assert summary["itl_s"]["count"] == 2 * 3  # gaps between 4 tokens, 2 requests
    assert 0.02 <= summary["itl_s"]["p50"] < 1.0
    assert summary["e2e_s"]["p50"] >= 0.05 + 3 * 0.02
    assert summary["output_tokens"] == 8
    assert summary["requests_per_s"] == pytest.approx(2 / summary["duration_s"])


def test_token_sources_add_up_across_a_restart(server, tmp_path) -> None:
    shape = plan.Shape("restart", users=3, rounds=4, system_tokens=24, question_tokens=8)

    async def restart() -> None:
        server.restart(down_s=0.2)

    report = asyncio.run(
        drive(
            shape,
            Sending(url=server.url, out=tmp_path, restart_command="x", qps=50.0),
            lambda line: None,
            hook=restart,
        )
    )
    sources = report["summary"]["sources"]["prompt_tokens"]
    truth_cached = sum(r.cached for r in server.received)
    truth_computed = sum(len(r.words) - r.cached for r in server.received)
    assert truth_cached > 0 and server.counters()["local_cache_hit"] < truth_cached  # reset
    assert sources == {"computed": truth_computed, "engine cache": truth_cached}
    # usage's cached tokens, per round, are the same server's figures
    for row in report["summary"]["rounds"]:
        mine = [r for (u, rnd), r in by_user_round(server).items() if rnd == row["round"]]
        assert row["cached_tokens"] == sum(r.cached for r in mine)
    # The restart emptied the cache: the round after it computed what the round before reused.
    rounds = {row["round"]: row for row in report["summary"]["rounds"]}
    assert (
        rounds[1]["cached_tokens"] > 0 and rounds[2]["cached_tokens"] < rounds[1]["cached_tokens"]
    )


def test_the_restart_command_runs_once_between_the_middle_rounds(server, tmp_path) -> None:
    command = (
        f'{sys.executable} -c "import urllib.request; urllib.request.urlopen('
        f"'{server.url}/fake/restart', data=b'{{\\\"down_s\\\": 0.3}}')\""
    )
    result = runner.invoke(
        app,
        [
            "bench", "workload", "--url", server.url, "--workload", "restart",
            "--users", "3", "--rounds", "4", "--system-tokens", "20", "--question-tokens", "8",
            "--answer-tokens", "4", "--qps", "40", "--restart-command", command,
            "--label", "fake", "--out", str(tmp_path),
        ],
        env={"COLUMNS": "200"},
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert len(server.restarts) == 1
    assert server.requests_before_restart == [3 * 2]  # rounds 1 and 2 of 3 users
    after = server.received[6:]
    assert all(r.at >= server.restarts[0] + 0.3 for r in after)  # waited for /health
    assert all(r.done_at <= server.restarts[0] for r in server.received[:6])
    report = json.loads((tmp_path / "workload-restart-fake.json").read_text())
    assert report["config"]["split_round"] == 2
    assert report["summary"]["command_s"] >= 0.3
    assert (tmp_path / "workload-restart.png").stat().st_size > 0
    assert "| fake | 12 (0) |" in (tmp_path / "workload-restart.md").read_text()


def test_the_same_seed_sends_the_same_prompts(tmp_path) -> None:
    sent = []
    for _ in range(2):
        fake = FakeOpenAIServer()
        try:
            shape = plan.Shape(
                "documents", documents=3, questions=2, order="random", document_tokens=30, seed=9
            )
            run(shape, fake, tmp_path, concurrency=1, qps=100.0)
        finally:
            fake.close()
        sent.append([r.words for r in fake.received])
    assert sent[0] == sent[1] and len(sent[0]) == 6


def test_runs_with_the_same_workload_share_one_table_and_plot(server, tmp_path) -> None:
    shape = plan.Shape("documents", documents=2, questions=2, document_tokens=20)
    for label in ("prefix-only", "kvtier"):
        report = run(shape, server, tmp_path, label=label)
        from kvtier.bench.workload import output

        output.publish(tmp_path, report, lambda line: None)
    other = plan.Shape("documents", documents=3, questions=2, document_tokens=20)
    output.publish(tmp_path, run(other, server, tmp_path, label="other"), lambda line: None)
    table = (tmp_path / "workload-documents.md").read_text()
    assert "| other |" in table and "| kvtier |" not in table  # other settings: apart
    output.publish(tmp_path, report, lambda line: None)
    table = (tmp_path / "workload-documents.md").read_text()
    assert "| prefix-only |" in table and "| kvtier |" in table and "| other |" not in table


def test_failed_requests_are_counted_and_the_run_goes_on(tmp_path) -> None:
    fake = FakeOpenAIServer(Settings(fail_indices={1}))
    try:
        result = runner.invoke(
            app,
            [
                "bench", "workload", "--url", fake.url, "--users", "2", "--rounds", "2",
                "--system-tokens", "10", "--concurrency", "1", "--out", str(tmp_path),
            ],
        )  # fmt: skip
    finally:
        fake.close()
    assert result.exit_code == 1
    report = json.loads((tmp_path / "workload-chat-run.json").read_text())
    assert report["summary"]["requests"] == 4 and report["summary"]["failed"] == 1
    assert report["requests"][1]["completion"]["error"].startswith("HTTP 500")
    assert len(fake.received) == 4  # the failed round's user still sent its next round


def test_pool_multiple_sizes_the_users_from_the_servers_cache(server, tmp_path) -> None:
    # The fake's cache: 64 blocks x 4 = 256 tokens; 3 rounds x (8 + 4) = 36 a user.
    shape = plan.Shape("chat", rounds=3, system_tokens=20, question_tokens=8, answer_tokens=4)
    report = run(shape, server, tmp_path, pool_multiple=2.0)
    assert report["config"]["shape"]["users"] == plan.users_for_pool(256, 2.0, 3, 20, 8, 4) == 14
    assert report["summary"]["pool_tokens"] == 256


def test_an_unreachable_server_exits_3(tmp_path) -> None:
    from kvtier.bench.harness.server import free_port

    result = runner.invoke(
        app,
        ["bench", "workload", "--url", f"http://127.0.0.1:{free_port()}", "--out", str(tmp_path)],
    )
    assert result.exit_code == 3
    assert "cannot read the server at" in result.output


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--workload", "restart"], "--restart-command goes with --workload restart"),
        (["--restart-command", "true"], "--restart-command goes with --workload restart"),
        (["--label", "a b"], "--label 'a b'"),
        (["--workload", "chats"], "workload 'chats'"),
        (["--qps", "-1"], "qps=-1"),
    ],
)
def test_bad_options_are_usage_errors(argv: list[str], message: str) -> None:
    result = runner.invoke(app, ["bench", "workload", *argv], env={"COLUMNS": "200"})
    assert result.exit_code == 2
    assert message in result.output


def test_help_documents_every_option() -> None:
    import typer.main

    bench = typer.main.get_command(app).commands["bench"]  # type: ignore[attr-defined]
    command = bench.commands["workload"]
    options = [p for p in command.params if p.name != "help"]
    assert len(options) >= 25
    assert [p.name for p in options if not (p.help or "").strip()] == []
    assert "Example: kvtier bench workload" in command.help
