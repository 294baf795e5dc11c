"""The Celery task functions only: each parses, calls the worker or watchdog package, and ends the task."""
