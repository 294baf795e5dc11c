"""Pure risky-settings checks behind ``unstuck config check``."""

from __future__ import annotations

from typing import Any

import pytest

from workers.core.config_checks import (
    AgentLimits,
    ConfigWarning,
    ToolLimits,
    check_agent,
    check_builtins,
    check_config,
    check_lease,
    check_loop_detection,
    check_tools,
)

ON = {"enabled": True}


def defaults(run_s: float | None = 1800, idle_s: float | None = 90, loops: Any = None) -> AgentLimits:
    return AgentLimits("agents.defaults", "defaults", run_s, idle_s, loops)


def entry(
    index: int, run_s: float | None = None, idle_s: float | None = None, loops: Any = None
) -> AgentLimits:
    return AgentLimits(f"agents.list[{index}]", f"agent 'a{index}'", run_s, idle_s, loops)


def paths(warnings: list[ConfigWarning]) -> list[str]:
    return [w.path for w in warnings]


@pytest.mark.parametrize(
    ("agent", "expected"),
    [
        (defaults(), []),
        (defaults(run_s=3599), []),
        (defaults(run_s=3600), ["agents.defaults.timeoutSeconds"]),
        (defaults(run_s=48 * 3600), ["agents.defaults.timeoutSeconds"]),
        (defaults(idle_s=None), ["agents.defaults.llm.idleTimeoutSeconds"]),
        (defaults(idle_s=600), ["agents.defaults.llm.idleTimeoutSeconds"]),
        (defaults(run_s=60, idle_s=90), ["agents.defaults.llm.idleTimeoutSeconds"]),
        (entry(0), []),  # inherits everything: nothing of its own to warn about
        (entry(1, run_s=7200), ["agents.list[1].timeoutSeconds"]),
        (entry(2, idle_s=3600), ["agents.list[2].llm.idleTimeoutSeconds"]),
    ],
)
def test_agent_timeouts(agent: AgentLimits, expected: list[str]) -> None:
    assert paths(check_agent(agent)) == expected


def test_long_run_warning_names_the_agent_and_value() -> None:
    (warning,) = check_agent(entry(3, run_s=7200))
    assert "agent 'a3'" in warning.message
    assert "7200s" in warning.message
    assert str(warning).startswith("agents.list[3].timeoutSeconds: ")


@pytest.mark.parametrize(
    ("global_block", "defaults_block", "agents", "expected"),
    [
        (None, None, [], ["tools.loopDetection"]),
        ({"enabled": False}, None, [], ["tools.loopDetection"]),
        ({"historySize": 30}, None, [], ["tools.loopDetection"]),
        (ON, None, [], []),
        (None, ON, [], []),
        (ON, {"enabled": False}, [], ["tools.loopDetection"]),
        (ON, None, [entry(0, loops={"warningThreshold": 5})], []),
        (ON, None, [entry(0, loops={"enabled": False})], ["agents.list[0].tools.loopDetection"]),
        # an agent's block replaces the defaults block, so it is off unless global turns it on
        (None, ON, [entry(1, loops={"historySize": 10})], ["agents.list[1].tools.loopDetection"]),
        # everything off: one warning for the defaults, not one per agent
        (None, None, [entry(0, loops={"enabled": False})], ["tools.loopDetection"]),
    ],
)
def test_loop_detection_off(
    global_block: Any, defaults_block: Any, agents: list[AgentLimits], expected: list[str]
) -> None:
    assert paths(check_loop_detection(global_block, defaults_block, agents)) == expected


def test_loop_detection_accepts_snake_case_blocks() -> None:
    assert check_loop_detection({"enabled": True, "history_size": 40}, None) == []


def test_history_shorter_than_every_threshold_warns_no_tier_can_fire() -> None:
    # Given historySize 5 with the thresholds 10/20/30 (the example)
    block = {
        "enabled": True,
        "historySize": 5,
        "warningThreshold": 10,
        "criticalThreshold": 20,
        "globalCircuitBreakerThreshold": 30,
    }
    # Then config check says so, on the historySize key
    found = check_loop_detection(block, None)
    assert paths(found) == ["tools.loopDetection.historySize"]
    assert "no tier can fire" in found[0].message


def test_history_between_tiers_names_the_tiers_that_never_fire() -> None:
    found = check_loop_detection({"enabled": True, "historySize": 15}, None)
    assert paths(found) == ["tools.loopDetection.historySize"]
    message = found[0].message
    assert "criticalThreshold 20" in message
    assert "globalCircuitBreakerThreshold 30" in message
    assert "warningThreshold" not in message
    assert "these never fire" in message


def test_unreachable_tiers_are_not_reported_while_detection_is_off() -> None:
    assert check_loop_detection({"enabled": False, "historySize": 5}, None) == paths_of_off()


def paths_of_off() -> list[ConfigWarning]:
    return check_loop_detection({"enabled": False}, None)


def test_unreachable_tiers_of_an_agent_block_name_the_agent() -> None:
    agents = [
        AgentLimits("agents.defaults", "defaults", None, None),
        AgentLimits("agents.list[0]", "agent 'a'", None, None, {"historySize": 3}),
    ]
    found = check_loop_detection({"enabled": True}, None, agents[1:])
    assert paths(found) == ["agents.list[0].tools.loopDetection.historySize"]
    assert found[0].message.startswith("agent 'a':")


def test_misordered_triple_is_reported_as_raised() -> None:
    # Given warning 30 over critical 20 and breaker 20 (OpenClaw raises these)
    found = check_loop_detection(
        {
            "enabled": True,
            "warningThreshold": 30,
            "criticalThreshold": 20,
            "globalCircuitBreakerThreshold": 20,
        },
        None,
    )
    messages = {warning.path: warning.message for warning in found}
    assert "raised to 31" in messages["tools.loopDetection.criticalThreshold"]
    assert "raised to 32" in messages["tools.loopDetection.globalCircuitBreakerThreshold"]


@pytest.mark.parametrize(
    ("tool", "warns"),
    [
        (ToolLimits("exec", 300, None, "tools.timeouts.exec"), False),
        (ToolLimits("exec", 10, 15, "tools.timeouts.exec"), False),
        (ToolLimits("exec", 15, 15, "tools.timeouts.exec"), True),
        (ToolLimits("exec", 300, 60, "tools.timeouts.exec"), True),
    ],
)
def test_soft_not_below_hard(tool: ToolLimits, warns: bool) -> None:
    assert paths(check_tools([tool])) == (["tools.timeouts.exec"] if warns else [])


@pytest.mark.parametrize(
    ("lease_ttl_s", "softs", "warns"),
    [
        (10, [300, 60], False),
        (10, [10], False),
        (10, [300, 5], True),
        (10, [], False),
    ],
)
def test_lease_above_shortest_tool_timeout(lease_ttl_s: float, softs: list[float], warns: bool) -> None:
    tools = [ToolLimits(f"t{i}", soft, None, f"tools.timeouts.t{i}") for i, soft in enumerate(softs)]
    found = check_lease(lease_ttl_s, tools)
    assert paths(found) == (["unstuck.lease.ttl_s"] if warns else [])
    if warns:
        assert "'t1'" in found[0].message


def test_check_config_collects_every_kind_defaults_first() -> None:
    # Given a config with one risk of each kind
    found = check_config(
        agents=[defaults(run_s=7200, idle_s=None), entry(0, run_s=5000)],
        global_loop_block=None,
        tools=[ToolLimits("slow", 400, 305, "tools.timeouts.slow"), ToolLimits("quick", 2, None, "q")],
        lease_ttl_s=10,
    )
    # Then each is reported once, in a stable order
    assert paths(found) == [
        "agents.defaults.timeoutSeconds",
        "agents.defaults.llm.idleTimeoutSeconds",
        "agents.list[0].timeoutSeconds",
        "tools.loopDetection",
        "tools.timeouts.slow",
        "unstuck.lease.ttl_s",
    ]


def test_safe_config_has_no_warnings() -> None:
    found = check_config(
        agents=[defaults(loops=ON)],
        global_loop_block=None,
        tools=[ToolLimits("exec", 300, None, "tools.timeouts.exec")],
        lease_ttl_s=10,
    )
    assert found == []


@pytest.mark.parametrize(
    ("builtins", "allow", "deny", "warns"),
    [
        ((), (), (), False),  # the default: no shell at all
        (("http_fetch",), (), (), False),
        (("exec",), (), (), True),  # a shell for every agent
        (("exec", "http_fetch"), (), (), True),
        (("exec",), ("echo",), (), False),  # an allowlist: exec only where it is listed
        (("exec",), ("exec",), (), False),  # listed on purpose
        (("exec",), (), ("exec",), False),  # enabled but denied everywhere
        (("exec",), (), ("group:builtins",), False),
        (("exec",), (), ("http_fetch",), True),
    ],
)
def test_exec_without_allowlist(
    builtins: tuple[str, ...], allow: tuple[str, ...], deny: tuple[str, ...], warns: bool
) -> None:
    found = check_builtins(builtins, allow, deny)
    assert paths(found) == (["tools.builtins"] if warns else [])
    if warns:
        assert "tools.allow" in found[0].message


def test_check_config_reports_exec_without_allowlist_last() -> None:
    found = check_config(
        agents=[defaults(loops=ON)],
        global_loop_block=None,
        tools=[],
        lease_ttl_s=10,
        builtins=("exec",),
    )
    assert paths(found) == ["tools.builtins"]


def test_failure_rules_for_unregistered_tools_say_did_you_mean() -> None:
    from workers.core.config_checks import check_failure_tools

    found = check_failure_tools(
        {"web_fetch", "cached_fetch"},
        {"tools.fallbacks": ["web_fech"], "tools.retry": ["web_fetch"], "tools.failBranch": ["web_fetch"]},
        {"web_fetch": "cache_fetch"},
    )
    assert [str(w) for w in found] == [
        "tools.fallbacks.web_fech: 'web_fech' is not a registered tool; did you mean 'web_fetch'?: "
        "this entry is never used",
        "tools.failBranch.web_fetch.tool: 'cache_fetch' is not a registered tool; "
        "did you mean 'cached_fetch'?: the first failure stands",
    ]
