"""One machine, for people: ``unstuck up``, ``unstuck demo``, their event printer and an embedded Redis.

Imported only by the CLI (and by tests and benchmarks), never by a production process's code.
"""
