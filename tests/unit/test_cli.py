"""`kvtier serve` builds the API-server command line; bad options exit 2 with the fix."""

import json
import shlex

from typer.testing import CliRunner

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
