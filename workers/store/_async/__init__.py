"""The store's hand-written asyncio modules, each the source of its ``_sync`` twin (dev/unasync.py)."""
