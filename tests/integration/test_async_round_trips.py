"""The asyncio path costs a call the Redis commands the sync path costs (no read before it blocks)."""

from __future__ import annotations

import pytest
import redis

from tests.harness import Proc
from workers import ToolCall, ToolGateway
from workers.settings import Settings


def _hget_calls(client: redis.Redis) -> int:
    return int(client.info("commandstats").get("cmdstat_hget", {}).get("calls", 0))


@pytest.mark.timeout(60)
async def test_an_async_call_is_not_read_before_its_first_block(
    worker: Proc, agateway: ToolGateway, settings: Settings
) -> None:
    if settings.redis.cluster:
        pytest.skip("the register script publishes the message only on a single Redis")
    client = redis.Redis.from_url(settings.redis.url)
    calls = [ToolCall(id="warm", name="echo", arguments={"text": "x"})]
    await agateway.acall_tools(session_key="rt", run_id="r1", calls=calls)  # the run opened, connected
    # Given the HGETs Redis has run so far
    before = _hget_calls(client)
    # When ten calls are made one after the other on the asyncio path
    for n in range(10):
        call = ToolCall(id=f"c{n}", name="echo", arguments={"text": "x"})
        (result,) = await agateway.acall_tools(session_key="rt", run_id="r1", calls=[call])
        assert result.text == "x"
    # Then none was read before its first block (the sync path's cost: it reads none either)
    assert _hget_calls(client) - before <= 2
    client.close()
