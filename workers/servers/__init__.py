"""The HTTP and MCP servers (the network doors): the HTTP API (``unstuck serve``) and ``unstuck mcp``.

Each runs in its own process and reaches the system through the gateway client, so an agent
loop in any language, or any MCP host, gets the same guarantees as an embedded ``ToolGateway``.
"""
