"""The invoke task: hand the delivery to the worker, end the task as the call ended."""

from __future__ import annotations

from typing import Any

from celery.exceptions import Ignore, Reject

from workers.celery_edge.app import app
from workers.celery_edge.messages import shown
from workers.celery_edge.names import INVOKE_TASK
from workers.core.job_digest import canonical_json
from workers.core.outcome import TaskState, outcome_of
from workers.errors import CallFailed
from workers.worker.calls import Refused, answer_call
from workers.worker.child_slots import holding

__all__ = ["invoke"]

_RESULT_REPR_LEVELS = 3  # the nesting Celery's saferepr shows of a task's return value (its default)


# shared=False: registered on the tool worker's app only, never on the watchdog's.
# throws: a call that failed is an expected outcome, logged without a traceback.
@app.task(
    name=INVOKE_TASK,
    bind=True,
    ignore_result=True,
    shared=False,
    throws=(CallFailed,),
    Request="workers.celery_edge.request:GuardedRequest",
)
def invoke(self: Any, job: dict[str, Any], loop_warning: dict[str, Any] | None = None) -> object:
    """Run one tool call; the task ends as the call did (see ``workers.core.outcome``).

    Returns the outcome's info for a tool's success (pre-rendered for Celery's log line and
    Flower: ``messages.shown``); raises its :class:`CallFailed` (no retry:
    the message was acked on receipt and the ledger already holds the answer) otherwise. A
    refused message is rejected; with no answer to report, the task's state is left alone.
    """
    canonical = canonical_json(job).encode()  # serialised once, for the claim's digest and the slot
    with holding(job, canonical):  # the worker's main process watches the call while the task runs
        answer = answer_call(job, canonical=canonical, task_id=self.request.id, trace_from=self.request)
    if isinstance(answer, Refused):
        raise Reject(answer.message, requeue=False)
    if answer is None:
        raise Ignore()
    outcome = outcome_of(answer, loop_warning)
    if outcome.state is TaskState.SUCCESS:
        return shown(outcome.info(), self.resultrepr_maxsize, _RESULT_REPR_LEVELS)
    raise outcome.failure()
