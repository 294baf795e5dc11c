"""The network doors' room: the HTTP API (``unstuck serve``) and the MCP server (``unstuck mcp``).

Each runs in its own process and reaches the system through the gateway client, so an agent
loop in any language, or any MCP host, gets the same guarantees as an embedded ``ToolGateway``.
"""
