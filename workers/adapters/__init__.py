"""Framework adapters: unstuck's tools inside other agent loops (each an optional extra).

``workers.adapters.langgraph`` (``pip install 'unstuck[langgraph]'``) and
``workers.adapters.openai_agents`` (``pip install 'unstuck[openai-agents]'``): importing one
without its extra raises ``ImportError`` naming the extra.
"""
