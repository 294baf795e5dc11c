"""OpenClaw's gateway RPC, through its own CLI (``openclaw gateway call METHOD --params JSON``).

The CLI speaks the gateway's WebSocket protocol (handshake, auth, scopes) the way the gateway
expects, so unstuck does not re-implement it. Used for ``sessions.abort`` (a call past its
budget that unstuck cannot end itself), ``sessions.send`` (telling the session what happened),
``sessions.list`` (the sessions its restart recovery tombstoned) and ``send`` (an alert to a
channel, what ``openclaw message send`` does through the gateway).
"""

from __future__ import annotations

import json
import logging
import subprocess
from typing import Any

from workers.settings import Settings

__all__ = ["GatewayRpc"]

log = logging.getLogger(__name__)

_TIMEOUT_S = 20.0
_SESSIONS_LIMIT = 500  # a tombstone is the newest update of its row: it is near the top


class GatewayRpc:
    """Calls into one OpenClaw gateway; every call is a no-op (None) without ``openclaw.cli``."""

    def __init__(self, settings: Settings) -> None:
        self._openclaw = settings.openclaw

    @property
    def configured(self) -> bool:
        """Whether an ``openclaw`` command is configured."""
        return bool(self._openclaw.cli)

    def call(self, method: str, params: dict[str, Any]) -> dict[str, Any] | None:
        """The method's JSON answer; None when not configured or when the call failed (logged)."""
        if not self.configured:
            return None
        argv = [self._openclaw.cli, "gateway", "call", method, "--json", "--params", json.dumps(params)]
        if self._openclaw.gateway_url:
            argv += ["--url", self._openclaw.gateway_url]
        token = self._openclaw.gateway_token.get_secret_value()
        if token:
            argv += ["--token", token]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            log.warning("openclaw gateway call %s failed: %s", method, exc)
            return None
        if done.returncode != 0:
            log.warning("openclaw gateway call %s exited %d: %s", method, done.returncode, done.stderr[-500:])
            return None
        try:
            answer = json.loads(done.stdout or "{}")
        except ValueError:
            return {"raw": done.stdout[-500:]}
        return answer if isinstance(answer, dict) else {"answer": answer}

    def abort(self, session_key: str, run_id: str) -> bool:
        """``sessions.abort`` of one run; whether the gateway accepted it."""
        return self.call("sessions.abort", {"key": session_key, "runId": run_id}) is not None

    def tell(self, session_key: str, message: str) -> bool:
        """``sessions.send`` a message into the session; whether the gateway accepted it."""
        return self.call("sessions.send", {"key": session_key, "message": message}) is not None

    def sessions(self, limit: int = _SESSIONS_LIMIT) -> dict[str, Any] | None:
        """``sessions.list``, newest update first (a tombstone is an update); None when not answered."""
        return self.call("sessions.list", {"limit": limit, "sortBy": "updatedAt"})

    def message(self, text: str, idempotency_key: str) -> bool:
        """``send`` ``text`` to ``openclaw.alert_target``; whether the gateway accepted it.

        The idempotency key makes a retried alert one message (OpenClaw dedupes on it).
        """
        params: dict[str, Any] = {
            "to": self._openclaw.alert_target,
            "message": text,
            "idempotencyKey": idempotency_key,
        }
        if self._openclaw.alert_channel:
            params["channel"] = self._openclaw.alert_channel
        if self._openclaw.alert_account:
            params["accountId"] = self._openclaw.alert_account
        return self.call("send", params) is not None
