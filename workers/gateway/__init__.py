"""The agent's process: the client the agent loop embeds (``ToolGateway``) and its stages.

Runs in the agent's own process. Admission (validation, loop gate), registration and dispatch,
waiting, ledger-aware transcript repair and the LLM idle guard. Never imported by the worker or
the watchdog.
"""
