"""`kvtier serve` builds the API-server command line; bad options exit 2 with the fix."""

import inspect
import json
import os
import shlex
import site
from pathlib import Path

from typer.testing import CliRunner

import kvtier
from kvtier import launch
from kvtier.cli.main import app

runner = CliRunner()


def test_serve_dry_run_passes_kvtier_config_and_unknown_args_to_vllm(tmp_path):
    result = runner.invoke(
        app,
        [
            "serve",
            "/models/m",
            "--disk-dir",
            str(tmp_path),
            "--disk-capacity",
            "2GiB",
            "--dry-run",
            "--max-model-len",
            "8192",
            "--port",
            "9000",
        ],
    )
    assert result.exit_code == 0, result.output
    argv = shlex.split(result.output.strip())
    assert argv[1:5] == ["-m", "vllm.entrypoints.openai.api_server", "--model", "/models/m"]
    config = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    extra = config["kv_connector_extra_config"]
    assert extra["spec_module_path"] == "kvtier.vllm.spec"
    assert extra["secondary_tiers"][0]["capacity_bytes"] == 2 * 2**30
    assert argv[-4:] == ["--max-model-len", "8192", "--port", "9000"]


def test_serve_refuses_a_second_transfer_config():
    result = runner.invoke(app, ["serve", "m", "--dry-run", "--kv-transfer-config", "{}"])
    assert result.exit_code == 2
    assert "--kv-transfer-config is set by kvtier serve" in result.output


def test_serve_reports_a_bad_size_as_a_usage_error():
    result = runner.invoke(app, ["serve", "m", "--dry-run", "--host-pool", "lots"])
    assert result.exit_code == 2
    assert "(host_pool / --host-pool)='lots': not a size" in result.output


def run_serve_capturing_exec(monkeypatch, env_changes: dict[str, str | None]) -> tuple[dict, dict]:
    """``kvtier serve m`` with ``os.execve`` caught: (caller's env, server's env)."""
    seen: dict[str, dict[str, str]] = {}

    def fake_execve(path: str, argv: list[str], env: dict[str, str]) -> None:
        seen["caller"] = dict(os.environ)
        seen["server"] = dict(env)

    monkeypatch.setattr(os, "execve", fake_execve)
    result = runner.invoke(app, ["serve", "m"], env=env_changes)
    assert result.exit_code == 0, result.output
    return seen["caller"], seen["server"]


def test_serve_passes_the_callers_environment_through_adding_only_pythonpath(monkeypatch):
    monkeypatch.setattr(launch, "installed", lambda: False)
    caller, server = run_serve_capturing_exec(
        monkeypatch,
        {
            "HF_HUB_OFFLINE": None,
            "TRANSFORMERS_OFFLINE": None,
            "VLLM_NO_USAGE_STATS": None,
            "HF_TOKEN": "t0ken",
            "PYTHONPATH": "/elsewhere",
        },
    )
    assert server == caller | {"PYTHONPATH": os.pathsep.join([str(launch.SRC_DIR), "/elsewhere"])}
    assert "HF_HUB_OFFLINE" not in server, "a machine that can download models must be able to"


def test_serve_leaves_the_callers_offline_choice_alone(monkeypatch):
    monkeypatch.setattr(launch, "installed", lambda: False)
    _, server = run_serve_capturing_exec(monkeypatch, {"HF_HUB_OFFLINE": "0"})
    assert server["HF_HUB_OFFLINE"] == "0"


def test_an_installed_kvtier_serves_with_the_environment_unchanged(monkeypatch):
    monkeypatch.setattr(launch, "installed", lambda: True)
    caller, server = run_serve_capturing_exec(monkeypatch, {"PYTHONPATH": None})
    assert server == caller
    assert "PYTHONPATH" not in server


def test_kvtier_already_on_pythonpath_is_not_added_twice(monkeypatch):
    monkeypatch.setattr(launch, "installed", lambda: False)
    base = {"PYTHONPATH": os.pathsep.join(["/a", str(launch.SRC_DIR)])}
    assert launch.serve_env(base) == base


def test_a_source_tree_is_not_mistaken_for_an_install(monkeypatch, tmp_path):
    monkeypatch.setattr(launch, "SRC_DIR", tmp_path)
    assert not launch.installed()


def test_a_kvtier_in_site_packages_counts_as_installed(monkeypatch):
    monkeypatch.setattr(launch, "SRC_DIR", Path(site.getsitepackages()[0]).resolve())
    assert launch.installed()


def test_demo_shared_without_a_server_binary_is_a_usage_error(monkeypatch):
    monkeypatch.setenv("KVTIER_REDIS_SERVER", "/nonexistent/redis-server")
    result = runner.invoke(app, ["demo", "--shared", "--tokens", "100"])
    assert result.exit_code == 2, result.output
    assert "--shared needs redis-server or valkey-server on PATH" in result.output


def test_serve_has_exactly_kv_transfer_configs_options():
    """The options are written twice (a Python signature, Typer's options); this keeps the
    two lists one, so an option added to one is never missing from the other."""
    from kvtier.cli import main

    serve_options = set(inspect.signature(main.serve).parameters) - {"ctx", "model", "dry_run"}
    python_options = set(inspect.signature(kvtier.kv_transfer_config).parameters)
    assert serve_options == python_options - {"extra", "platform"}
    assert set(main.TRANSFER_OPTIONS) == serve_options


def test_serve_passes_each_option_on(tmp_path):
    result = runner.invoke(
        app,
        [
            "serve", "m", "--dry-run", "--host-pool", "64MiB", "--disk-dir", str(tmp_path),
            "--disk-capacity", "1GiB", "--disk-threads", "3", "--fsync", "data",
            "--allow-small-tiers", "--no-restore-decision", "--shared", "redis://cache:6390",
            "--shared-username", "kv",
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    config = json.loads(shlex.split(result.output)[-1])
    extra = config["kv_connector_extra_config"]
    assert extra["cpu_bytes_to_use"] == 64 << 20
    assert extra["kvtier"]["allow_small_tiers"] is True
    assert extra["kvtier"]["restore_decision"] is False
    (tier,) = extra["secondary_tiers"]
    assert (tier["capacity_bytes"], tier["io_threads"], tier["fsync"]) == (1 << 30, 3, "data")
    assert (tier["shared"]["url"], tier["shared"]["username"]) == ("redis://cache:6390", "kv")


def cuda_build(monkeypatch, hash_seed: bool) -> None:
    """``kvtier serve`` on a CUDA build of vLLM (distribution metadata, as the release package
    reads it); ``hash_seed``: its block hashes need ``PYTHONHASHSEED`` (0.25.1, 0.26.0)."""
    from kvtier.vllm import release

    monkeypatch.setattr(release, "installed_platform", lambda: "cuda")
    monkeypatch.setattr(release, "needs_hash_seed", lambda: hash_seed)
    monkeypatch.setattr(launch, "installed", lambda: True)


def test_serve_on_a_cuda_build_runs_vllms_own_host_pool_with_kvtiers_tiers(monkeypatch, tmp_path):
    cuda_build(monkeypatch, hash_seed=False)
    result = runner.invoke(app, ["serve", "m", "--dry-run", "--disk-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    argv = shlex.split(result.output.strip().splitlines()[-1])
    extra = json.loads(argv[argv.index("--kv-transfer-config") + 1])["kv_connector_extra_config"]
    assert extra["spec_name"] == "KvtierCudaSpec"
    assert extra["secondary_tiers"][0]["type"] == "KvtierDiskTier"
    refused = runner.invoke(app, ["serve", "m", "--dry-run", "--host-pool-dir", str(tmp_path)])
    assert refused.exit_code == 2 and "platform='cuda'" in refused.output


def test_serve_sets_pythonhashseed_where_the_cuda_release_needs_it(monkeypatch):
    cuda_build(monkeypatch, hash_seed=True)
    # The caller's own CPU settings (the test session sets some) are unset, so any in the
    # server's environment would be serve's.
    cpu_settings = {k: None for k in os.environ if k.startswith("VLLM_CPU")}
    caller, server = run_serve_capturing_exec(monkeypatch, {"PYTHONHASHSEED": None, **cpu_settings})
    assert server == caller | {"PYTHONHASHSEED": "0"}
    assert not [k for k in server if k.startswith("VLLM_CPU")], "no CPU-only settings"


def test_serve_keeps_the_callers_hash_seed(monkeypatch):
    cuda_build(monkeypatch, hash_seed=True)
    caller, server = run_serve_capturing_exec(monkeypatch, {"PYTHONHASHSEED": "7"})
    assert server == caller and server["PYTHONHASHSEED"] == "7"


def test_serve_adds_no_seed_where_the_release_hashes_alike_without_one(monkeypatch):
    cuda_build(monkeypatch, hash_seed=False)
    caller, server = run_serve_capturing_exec(monkeypatch, {"PYTHONHASHSEED": None})
    assert server == caller and "PYTHONHASHSEED" not in server
