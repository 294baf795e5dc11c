"""What the HTTP door does for each route, in plain Python: easy to test without HTTP.

Waiting routes (``arun``, ``acollect``) are awaited on the gateway's asyncio path, so a
waiting request holds no thread; the others are short blocking store calls.
"""

from __future__ import annotations

from typing import Any

from workers.gateway.client import ToolGateway
from workers.gateway.ledger_repair import repair_in_format
from workers.runtime import now_ms, open_ledger
from workers.settings import Settings
from workers.store.server import ping_error
from workers.store.sessions import SessionStore
from workers.watchdog.operator_view import session_rows

__all__ = ["CallsDoor"]


class CallsDoor:
    """One gateway shared by every request of the server (it is thread-safe per call)."""

    def __init__(self, settings: Settings, gateway: ToolGateway | None = None) -> None:
        self.settings = settings
        self.gateway = gateway or ToolGateway(settings)
        self._sessions = SessionStore(open_ledger(settings))

    def run(self, session_key: str, run_id: str, agent_id: str, fmt: str, message: Any) -> dict[str, Any]:
        """Run the message's calls; the results, what to append in ``fmt``, and any abort."""
        answer = self.gateway.call_tools_in(
            fmt, message, session_key=session_key, run_id=run_id, agent_id=agent_id
        )
        return _shape(answer.results, answer.append, answer.aborted)

    async def arun(
        self, session_key: str, run_id: str, agent_id: str, fmt: str, message: Any
    ) -> dict[str, Any]:
        """``run``, awaited: no thread is held while the calls run."""
        answer = await self.gateway.acall_tools_in(
            fmt, message, session_key=session_key, run_id=run_id, agent_id=agent_id
        )
        return _shape(answer.results, answer.append, answer.aborted)

    async def acollect(self, session_key: str, run_id: str, fmt: str) -> dict[str, Any]:
        """``collect``, awaited."""
        results = await self.gateway.acollect(session_key, run_id)
        return _shape(results, self.gateway.results_in(fmt, results), None)

    def collect(self, session_key: str, run_id: str, fmt: str) -> dict[str, Any]:
        """Every call's result of a run, waiting for live ones, in the same shape as ``run``."""
        results = self.gateway.collect(session_key, run_id)
        return _shape(results, self.gateway.results_in(fmt, results), None)

    def tool_definitions(self, fmt: str, agent_id: str | None = None) -> list[Any]:
        """The registered tools (those ``agent_id`` may call, if given), for the model, in ``fmt``."""
        return list(self.gateway.tool_definitions(format=fmt, agent_id=agent_id))

    def repair(
        self, fmt: str, transcript: Any, provider: str | None, model_api: str | None, model_id: str | None
    ) -> dict[str, Any]:
        """The transcript repaired for its provider's policy, and the report."""
        repaired, full = repair_in_format(
            self.settings, transcript, fmt=fmt, provider=provider, model_api=model_api, model_id=model_id
        )
        return {"transcript": repaired, "report": full.report.to_json()}

    def sessions(self) -> list[dict[str, Any]]:
        """What ``unstuck session list --json`` prints."""
        stalled_after_ms = int(self.settings.watchdog.stalled_after_s * 1000)
        return session_rows(
            SessionStore(self.gateway._rt.ledger), now=now_ms(), stalled_after_ms=stalled_after_ms
        )

    def store_problem(self) -> str | None:
        """None when Redis answers a PING, else what failed."""
        redis = self.settings.redis
        return ping_error(
            redis.url,
            socket_timeout_s=redis.socket_timeout_s,
            socket_connect_timeout_s=redis.socket_connect_timeout_s,
            cluster=redis.cluster,
            sentinel=redis.sentinel_access(),
        )

    def close(self) -> None:
        """Release the gateway's connections."""
        self.gateway.close()
        self._sessions.ledger.close()

    async def aclose(self) -> None:
        """Release the gateway's connections, its asyncio client's included (on the server's loop)."""
        await self.gateway.aclose()
        self._sessions.ledger.close()


def _shape(results: list[Any], append: Any, aborted: Any) -> dict[str, Any]:
    return {"results": [r.to_neutral() for r in results], "append": append, "aborted": aborted}
