"""Tool allow/deny lists: which tools an agent may call (pure, no settings)."""

from __future__ import annotations

import pytest

from workers.core.tool_policy import BUILTIN_TOOLS, GROUPS, ToolPolicy, ToolRules, unknown_groups

NO_RULES = ToolRules()


@pytest.mark.parametrize(
    ("rules", "tool", "allowed"),
    [
        (NO_RULES, "exec", True),  # no lists: every registered tool
        (ToolRules(allow=("echo",)), "echo", True),
        (ToolRules(allow=("echo",)), "exec", False),  # an allowlist admits only what it names
        (ToolRules(allow=("*",)), "anything", True),
        (ToolRules(allow=("group:builtins",)), "exec", True),
        (ToolRules(allow=("group:builtins",)), "http_fetch", True),
        (ToolRules(allow=("group:builtins",)), "echo", False),
        (ToolRules(deny=("exec",)), "exec", False),
        (ToolRules(deny=("exec",)), "echo", True),
        (ToolRules(allow=("exec",), deny=("exec",)), "exec", False),  # deny wins
        (ToolRules(allow=("*",), deny=("group:builtins",)), "http_fetch", False),
        (ToolRules(allow=("*",), deny=("group:builtins",)), "echo", True),
        (ToolRules(deny=("*",)), "echo", False),
        (ToolRules(allow=("Exec",)), "exec", False),  # names are exact, as the registry's
    ],
)
def test_one_layer(rules: ToolRules, tool: str, allowed: bool) -> None:
    assert rules.allows(tool) is allowed
    assert ToolPolicy((rules,)).allows(tool) is allowed


@pytest.mark.parametrize(
    ("global_rules", "agent_rules", "tool", "allowed"),
    [
        # the agent narrows the global allowlist
        (ToolRules(allow=("echo", "exec")), ToolRules(allow=("echo",)), "echo", True),
        (ToolRules(allow=("echo", "exec")), ToolRules(allow=("echo",)), "exec", False),
        # ... and can never widen it
        (ToolRules(allow=("echo",)), ToolRules(allow=("exec",)), "exec", False),
        (ToolRules(allow=("echo",)), ToolRules(allow=("*",)), "exec", False),
        (ToolRules(deny=("exec",)), ToolRules(allow=("exec",)), "exec", False),
        # an agent without lists keeps the global ones
        (ToolRules(allow=("echo",)), NO_RULES, "echo", True),
        (ToolRules(allow=("echo",)), NO_RULES, "exec", False),
        # the agent's own deny adds to the global rules
        (NO_RULES, ToolRules(deny=("group:builtins",)), "exec", False),
        (NO_RULES, ToolRules(deny=("group:builtins",)), "echo", True),
        (NO_RULES, ToolRules(allow=("echo",)), "exec", False),
    ],
)
def test_agent_layer_only_narrows(
    global_rules: ToolRules, agent_rules: ToolRules, tool: str, allowed: bool
) -> None:
    assert ToolPolicy((global_rules, agent_rules)).allows(tool) is allowed


def test_filter_keeps_order_and_drops_the_refused() -> None:
    policy = ToolPolicy((ToolRules(allow=("zeta", "group:builtins"), deny=("exec",)),))
    assert policy.filter(["zeta", "exec", "echo", "http_fetch"]) == ["zeta", "http_fetch"]


def test_restricted_only_when_a_list_is_set() -> None:
    assert not ToolPolicy().restricted
    assert not ToolPolicy((NO_RULES, NO_RULES)).restricted
    assert ToolPolicy((NO_RULES, ToolRules(deny=("exec",)))).restricted


def test_groups_and_unknown_groups() -> None:
    assert GROUPS["group:builtins"] == BUILTIN_TOOLS == ("exec", "http_fetch")
    assert unknown_groups(["group:builtins", "exec", "*", "group:fs"]) == ["group:fs"]
