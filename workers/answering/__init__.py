"""The one service that answers calls: every writer of a call's one result goes through it.

:mod:`~workers.answering.rules` turns a failure into what the agent is given (``tools.fallbacks``,
pure); :mod:`~workers.answering.service` writes it first writer wins through the store and,
when another writer won, reads back and returns the kept answer. The gateway, its dispatcher,
waiter and canceller, the watchdog, the worker (main process and pool child), a run's end and
both network doors answer through :class:`~workers.answering.service.Answers`.
"""
