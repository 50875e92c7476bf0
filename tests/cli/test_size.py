"""`kvtier size` prints each tier's capacity without an engine; a sizing trap exits 2."""

import json

import pytest
from typer.testing import CliRunner

import kvtier
from kvtier.cli.main import app
from kvtier.errors import ConfigError

SMOLLM2 = {
    "model_type": "llama",
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "head_dim": 64,
    "hidden_size": 576,
    "dtype": "float32",
}
runner = CliRunner()


@pytest.fixture
def model_dir(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(SMOLLM2))
    return tmp_path


def size(*args):
    return runner.invoke(app, ["size", *map(str, args)], env={"COLUMNS": "160"})


def test_size_table_shows_tokens_per_tier_right_aligned(model_dir):
    result = size(
        model_dir, "--engine-kv", "1GiB", "--host-pool", "2GiB", "--disk-capacity", "64GiB"
    )
    assert result.exit_code == 0, result.output
    assert "30 layers, 3 KV heads x 64, float32 KV: 45.00 KiB per token" in result.output
    rows = {line.split("│")[1].strip(): line for line in result.output.splitlines() if "│" in line}
    assert "23,296" in rows["engine KV pool"]
    assert "46,592" in rows["host pool"] and "yes" in rows["host pool"]
    assert "1,490,176" in rows["disk tier"]
    cells = rows["host pool"].split("│")
    assert cells[5].endswith("46,592 ")  # right-aligned number column


def test_size_json_has_layout_tiers_and_verdicts(model_dir):
    result = size(model_dir, "--engine-kv", "1GiB", "--host-pool", "2GiB", "--json")
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["layout"]["offloaded_bytes_per_token"] == 46080
    assert [t["units"] for t in report["tiers"]] == [182, 364]
    assert report["traps"] == []


def test_size_sizing_trap_exits_2_and_says_what_would_work(model_dir):
    result = size(model_dir, "--engine-kv", "4GiB", "--host-pool", "2GiB")
    assert result.exit_code == 2
    assert "NO (sizing trap)" in result.output
    assert "kvtier would refuse to start: host pool: host_pool=2.00 GiB" in result.output
    assert "Give host_pool more than 4.00 GiB, e.g. 8.25GiB" in result.output


def test_size_reads_the_engine_pool_from_vllm_cpu_kvcache_space(model_dir):
    result = runner.invoke(
        app,
        ["size", str(model_dir), "--json"],
        env={"VLLM_CPU_KVCACHE_SPACE": "1", "COLUMNS": "160"},
    )
    assert json.loads(result.output)["tiers"][0]["capacity_bytes"] == 2**30


def test_size_without_an_engine_pool_asks_for_one(model_dir, monkeypatch):
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    result = size(model_dir)
    assert result.exit_code == 2
    assert "give --engine-kv" in result.output


def test_size_of_a_folder_without_config_json_is_a_usage_error(tmp_path):
    result = size(tmp_path, "--engine-kv", "1GiB")
    assert result.exit_code == 2
    assert "config.json not found" in result.output


def test_serve_passes_the_pool_folder_and_the_opt_out_to_the_config(tmp_path):
    result = runner.invoke(
        app,
        ["serve", "m", "--dry-run", "--host-pool-dir", str(tmp_path), "--allow-small-tiers"],
    )
    assert result.exit_code == 0, result.output
    config = json.loads(result.output.split("--kv-transfer-config ")[1].split("'")[1])
    extra = config["kv_connector_extra_config"]
    assert extra["kvtier"]["host_pool_dir"] == str(tmp_path)
    assert extra["kvtier"]["allow_small_tiers"] is True


def test_kv_transfer_config_keeps_a_ram_pool_that_refuses_small_tiers_by_default():
    extra = kvtier.kv_transfer_config()["kv_connector_extra_config"]
    assert extra["kvtier"] == {
        "host_pool_dir": None,
        "allow_small_tiers": False,
        "restore_decision": True,
    }


def test_kv_transfer_config_makes_the_pool_folder_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    extra = kvtier.kv_transfer_config(host_pool_dir="pool")["kv_connector_extra_config"]
    assert extra["kvtier"]["host_pool_dir"] == str(tmp_path / "pool")


def test_kv_transfer_config_refuses_a_non_bool_opt_out():
    with pytest.raises(ConfigError, match=r"allow_small_tiers \(.*\)='yes'.*give true or false"):
        kvtier.kv_transfer_config(allow_small_tiers="yes")
