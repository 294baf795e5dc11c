"""The tool worker process: what runs inside ``celery worker`` besides the Celery edge.

The Celery adapters (the invoke task in ``tasks/``, the request class and bootsteps in
:mod:`workers.celery_edge`) hand each delivery and each main-process tick to this package.

Runs in the worker's pool children (tool execution) and main process. Never imported by the
gateway or the watchdog.
"""
