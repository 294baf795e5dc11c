"""The store's sync modules, each generated from its asyncio source (dev/unasync.py): do not edit."""
