"""No thread of a traced worker imports a module while its pool may fork: a child would hang.

A pool child forked while another thread of its parent imports a module inherits that
module's import lock held, and hangs on its own first import of it. It happened: the worker's
main process sent its first spans (a crashed child's, a hard limit's) on the SDK's batch
thread, which imported netrc, while the pool forked the dead child's replacement; that child
hung on its first export and none of its spans ever arrived (test_tracing_e2e, in CI).
Python's audit hook sees every import as it starts loading; a ``sitecustomize`` on the
workers' path records each one made off a process's main thread.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tests.e2e.conftest import Processes
from tests.harness import REPO, base_env, settings_of
from tests.otlp_receiver import otlp_receiver
from workers import ToolCall, ToolGateway
from workers.local.embedded_redis import EmbeddedRedis

pytestmark = [pytest.mark.slow]

_RECORDER = """
    import os, sys, threading

    def _off_main_thread(event, args):
        if event == "import" and threading.current_thread() is not threading.main_thread():
            with open(os.path.join({out!r}, f"{{os.getpid()}}.txt"), "a") as out:
                out.write(f"{{threading.current_thread().name}} {{args[0]}}\\n")

    if "worker" in sys.argv:
        sys.addaudithook(_off_main_thread)
"""


@pytest.mark.timeout(120)
def test_a_traced_worker_imports_nothing_off_its_main_thread(
    private_redis: EmbeddedRedis, processes: Processes, tmp_path: Path
) -> None:
    # Given a worker that sends its spans to a collector, with every import off a main thread recorded
    site, seen = tmp_path / "site", tmp_path / "imports"
    site.mkdir()
    seen.mkdir()
    (site / "sitecustomize.py").write_text(textwrap.dedent(_RECORDER.format(out=str(seen))))
    with otlp_receiver() as receiver:
        env = {
            **base_env(private_redis.url),
            "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
            "PYTHONPATH": f"{site}:{REPO}",
        }
        worker = processes.worker(env, name="forks", concurrency=2)
        # When its children crash and hit their hard limits (the main process answers, sends
        # their spans and forks their replacements), and the replacements run calls
        gateway = ToolGateway(settings_of(env))
        try:
            for round_ in range(2):
                calls = [  # one child each: both replaced
                    ToolCall(id=f"crash-{round_}", name="crash", arguments={"how": "sigkill"}),
                    ToolCall(id=f"hung-{round_}", name="stubborn", arguments={"seconds": 30}),
                ]
                gateway.call_tools(session_key="forks", run_id=f"r{round_}", calls=calls)
                echoes = [
                    ToolCall(id=f"echo-{round_}-{i}", name="echo", arguments={"text": "x"}) for i in range(4)
                ]
                results = gateway.call_tools(session_key="forks", run_id=f"e{round_}", calls=echoes)
                assert [r.reason for r in results] == [None] * 4
        finally:
            gateway.close()
        worker.stop()
        sent = {span.attributes.get("gen_ai.tool.call.id") for span in receiver.named("unstuck.run echo")}
    # Then every call's span arrived, and no thread but a main one imported anything
    assert sent == {f"echo-{r}-{i}" for r in range(2) for i in range(4)}
    imports = {path.name: path.read_text().splitlines() for path in seen.iterdir()}
    assert imports == {}, imports
