"""`kvtier demo` end to end at a small prompt: the shared-tier step restores on a second server.

One run of the real command (SmolLM2-135M, three `kvtier serve` processes, a throw-away Redis
server): its exit code is 0 only when every restored output equals the engine's own
prefix-cache resume and the second server, its disk folder empty, took its prompt from the
shared server (kvtier read bytes from the shared store and none from its disk). Afterwards
nothing it started still listens and its temporary folder is gone.
"""

import socket
import tempfile

import pytest

from kvtier.bench.redis_servers import free_port, server_binary
from kvtier.demo import run_demo

pytestmark = [pytest.mark.engine, pytest.mark.real_model, pytest.mark.timeout(900)]


def listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def free_port_pair() -> int:
    """A loopback port free together with the next one (the demo's second server)."""
    while True:
        port = free_port()
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port


def test_demo_restores_on_a_second_server_from_the_shared_tier_and_cleans_up(
    monkeypatch, tmp_path, capsys
):
    if server_binary() is None:
        pytest.skip("no redis-server on PATH (run scripts/redis-server.sh)")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the demo's work folder goes
    port = free_port_pair()

    code = run_demo(tokens=700, port=port, work_dir=None, shared=True)

    out = " ".join(capsys.readouterr().out.split())  # undo the console's line wrapping
    assert code == 0, out
    assert "equal the engine's own prefix-cache resume: yes" in out
    assert "its disk folder holding 0 records, took 640 of 700 prompt tokens" in out
    assert "restored from the shared tier" in out
    assert "shared tier, 2nd server" in out
    assert list(tmp_path.glob("kvtier-demo-*")) == [], "the temporary work folder is removed"
    assert not listening(port) and not listening(port + 1)
