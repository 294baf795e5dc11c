"""Tool registry, loader and built-in tools (may do I/O; never imports Celery)."""
