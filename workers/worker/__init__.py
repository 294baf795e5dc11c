"""The tool worker's room: what runs inside ``celery worker`` besides the Celery adapters in ``tasks/``.

Runs in the worker's pool children (tool execution) and main process. Never imported by the
gateway or the watchdog.
"""
