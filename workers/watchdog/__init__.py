"""The watchdog process: the sweep over due calls and runs, lane housekeeping and alerts.

Runs in the process that consumes the control queue (beat-scheduled), never in a tool worker's
pool. The decisions themselves are pure, in :mod:`workers.core.run_health` and
:mod:`workers.core.waiting`.
"""
