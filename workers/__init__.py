"""unstuck: every tool call of an agent gets exactly one result, on time."""
