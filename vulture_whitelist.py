"""Names vulture cannot see used, each reviewed: `make lint` runs vulture on the product code.

vulture reads only workers/, tasks/ and beat_schedule.py, so a name used from outside them
(a framework calling a hook, a test) looks unused. Every entry below says who uses it. A new
finding is either dead code to delete or a hook to add here with its reason. Functions that a
decorator registers (pydantic validators, FastAPI routes) are skipped by `ignore_decorators`
in pyproject.toml instead.
"""

from vulture.whitelist_utils import Whitelist

_ = Whitelist()

# --- Framework hooks: called by Celery, kombu, pydantic, LangChain or Python itself ---------------

_.buffer_limit  # celery EventDispatcher batching (workers/celery_edge/task_events.py)
_.on_send_event_buffered  # celery Consumer hook the Events step hands on (workers/celery_edge/consumer.py)
_.on_close  # celery Consumer hook on a lost connection (workers/celery_edge/consumer.py)
_.buffer_group  # celery EventDispatcher batching (workers/celery_edge/task_events.py)
_.worker_consumer  # celery app attribute naming the consumer class (workers/celery_edge/app.py)
_.requires  # celery bootstep's dependencies, read by the blueprint (workers/celery_edge/child_exits.py)
_.include_if  # celery bootstep predicate, called by the blueprint (workers/celery_edge/give_back.py)
_.beat_schedule  # celery beat's schedule, read by beat (workers/celery_edge/app_config.py)
_.__getattr__  # PEP 562 lazy module attributes (workers/__init__.py, workers/celery_edge/app.py)
_.__dir__  # PEP 562, what dir() lists of a lazy module (workers/__init__.py)
_._arun  # LangChain BaseTool's async entry point (workers/adapters/langgraph.py)
_.get_field_value  # pydantic-settings source API (workers/config_file.py)
_.settings_customise_sources  # pydantic-settings hook (workers/settings.py)
_.dotenv_settings  # a parameter of that hook's signature, unused by design
_.file_secret_settings  # a parameter of that hook's signature, unused by design
_.post_compaction_guard  # pydantic field of the loop block, read by alias (workers/core/loops/config.py)
_.skip_known  # call-path stage, called by name from CallPath.STAGES (workers/gateway/call_path.py)
_.refuse_aborted_run  # call-path stage, called by name from CallPath.STAGES
_.check_loops  # call-path stage, called by name from CallPath.STAGES
_.register_and_dispatch  # call-path stage, called by name from CallPath.STAGES

# --- Record fields: written as a whole, read by name in tests, JSON views or task results --------

_.builder  # schema records: tests/unit/test_records.py holds each declared key to what its builder makes
_.ended_ms  # RunInfo, a run record as stored (workers/store/sessions.py)
_.end_reason  # RunInfo, the same
_.last_gap_ms  # SweepRecord, the last sweep as stored (workers/store/watchdog_liveness.py)
_.sweeps  # SweepRecord, the same
_.dropped  # SweepReport, the sweep task's result (workers/watchdog/sweep.py)
_.paired_tool_name  # LoopVerdict: the ping-pong detector's other tool (workers/core/loops/detectors.py)

# --- Used only by tests: to delete with the store and loop consolidation that owns them ---------

_.disarm_guard  # LoopHistory.disarm_guard, three implementations (workers/core/loops, workers/store)
_.begin_run  # SessionStore.begin_run, for tests and bench (the gateway calls begin_and_open)
