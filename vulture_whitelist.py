"""Names vulture cannot see used, each reviewed: `make lint` runs vulture on the product code.

vulture reads only workers/, tasks/ and beat_schedule.py, so a name used from outside them
(a framework calling a hook, a test) looks unused. Every entry below says who uses it. A new
finding is either dead code to delete or a hook to add here with its reason.
"""

from vulture.whitelist_utils import Whitelist

_ = Whitelist()

# --- Framework hooks: called by Celery, kombu, pydantic, FastAPI, LangChain or Python itself --------

_.requires  # celery bootstep dependencies (workers/celery_edge/event_batching.py)
_.buffer_limit  # celery EventDispatcher batching (workers/celery_edge: event_batching, task_events)
_.on_send_buffered  # celery EventDispatcher hook (workers/celery_edge/event_batching.py)
_.buffer_group  # celery EventDispatcher batching (workers/celery_edge/task_events.py)
_.worker_consumer  # celery app attribute naming the consumer class (workers/celery_edge/app.py)
_.no_ack_consumers  # kombu Consumer option, read by kombu (workers/celery_edge/amqp.py)
_.beat_schedule  # celery beat's schedule, read by beat (workers/celery_edge/app_config.py)
_.__getattr__  # PEP 562 lazy module attributes (workers/__init__.py, workers/celery_edge/app.py)
_.__dir__  # PEP 562 (workers/__init__.py)
_._arun  # LangChain BaseTool's async entry point (workers/adapters/langgraph.py)
_.get_field_value  # pydantic-settings source API (workers/config_file.py)
_.settings_customise_sources  # pydantic-settings hook; its unused parameters are the hook's signature
_.dotenv_settings
_.file_secret_settings
_._all_or_nothing  # pydantic validators (workers/settings.py), run by pydantic
_._unique_ids
_._known
_._no_branch_to_itself
_._known_builtins
_._renew_before_expiry
_._sentinel_consistent
_._split_tokens
_._broker_off_the_cluster
_.post_compaction_guard  # pydantic field of the loop block, read by alias (workers/core/loops/config.py)
_.invalid  # FastAPI exception handler and routes, registered by decorator (workers/doors/http_api.py)
_.compaction
_.healthz
_.skip_known  # call-path stages, called by name from CallPath.STAGES (workers/gateway/call_path.py)
_.refuse_aborted_run
_.check_loops
_.register_and_dispatch

# --- Record fields: written as a whole, read by name in tests, JSON views or task results --------

_.builder  # schema records: tests/unit/test_records.py holds each declared key to what its builder makes
_.ended_ms  # RunInfo, a run record as stored (workers/store/sessions.py)
_.end_reason
_.last_gap_ms  # SweepRecord, the last sweep as stored (workers/store/watchdog_liveness.py)
_.sweeps
_.dropped  # SweepReport, the sweep task's result (workers/watchdog/sweep.py)
_.paired_tool_name  # LoopVerdict: the ping-pong detector's other tool (workers/core/loops/detectors.py)

# --- Used only by tests: candidates for deletion, left for the call-path refactor ----------------

_.restricted  # ToolPolicy.restricted (workers/core/tool_policy.py)
_.disarm_guard  # LoopHistory.disarm_guard, three implementations (workers/core/loops, workers/store)
_.rejected  # ProviderAnswer.rejected (workers/core/provider_calls.py)
