"""Turn tool calls into ledger records and task messages; the gateway's submission half."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cache, lru_cache
from typing import Any

from celery import Celery

from workers import tracing
from workers.answering.service import Answers, Immediate
from workers.celery_edge.messages import TaskMessages, fast_publish_possible
from workers.celery_edge.names import INVOKE_TASK, INVOKE_TASK_ID, INVOKE_TASK_LABEL
from workers.core.call_limits import resolve_limits
from workers.core.job_digest import job_digest
from workers.core.mcp_upstreams import upstream_queue
from workers.core.models import CallJob, SyntheticReason, ToolCall, ToolResult
from workers.core.provider_calls import RejectedCall
from workers.core.results import not_allowed_result, rejected_result, synthetic_result
from workers.core.tool_policy import ToolPolicy
from workers.errors import InvalidArguments, ToolNotFound
from workers.settings import Settings
from workers.store.keys import RunKeys, broker_queue_key
from workers.store.ledger import Ledger, Registration
from workers.store.records import CallField
from workers.tools.registry import get_tool, validate_arguments

__all__ = ["Dispatcher", "Submission", "task_id"]

log = logging.getLogger(__name__)


def task_id(keys: RunKeys, call_id: str, attempt: int) -> str:
    """The Celery task id of one dispatch of a call (readable in Flower, unique per attempt)."""
    return INVOKE_TASK_ID.format(due_member=keys.due_member(call_id), attempt=attempt)


def _no_event(fields: dict[str, Any]) -> None:
    return None


@dataclass(frozen=True)
class InvokeOptions:
    """What every message of a call carries besides its job: one place computes it."""

    # The call's deadline: send_task's messages carry it, so a broker with message TTLs drops
    # one nobody took by then (the register script's pushed message does not: see messages.py).
    expires: datetime
    label: str  # the name Flower shows (tool, session, run)
    queue: str

    @classmethod
    def of(cls, job: CallJob, queue: str) -> InvokeOptions:
        return cls(
            expires=datetime.fromtimestamp(job.deadline_ms / 1000, tz=UTC),
            label=INVOKE_TASK_LABEL.format(
                tool=job.call.name, session_key=job.session_key, run_id=job.run_id
            ),
            queue=queue,
        )


@dataclass(frozen=True)
class Submission:
    """The whole registration of one new call, for either submitter: what both register and send.

    ``fields`` are the call record's; ``push`` the first message for the register script to
    push onto the broker's list (None: published with ``send_task`` once registered).
    """

    keys: RunKeys
    job: CallJob
    fields: dict[str, str]
    push: tuple[str, str] | None
    options: InvokeOptions
    loop_warning: dict[str, Any] | None

    @property
    def task_id(self) -> str:
        """The task id of the call's first message."""
        return task_id(self.keys, self.job.call.id, 0)


class Dispatcher:
    """Validates, registers and publishes calls.

    ``on_sent`` gets the ``task-sent`` event fields of each published task (to batch them for
    Flower: Celery's own ``task_send_sent_event`` is off, it cost a publish per call).

    With a plain Redis broker on the ledger's own node (:func:`fast_publish_possible`), a new
    call's message is built here (:mod:`workers.celery_edge.messages`) and pushed by the
    register script itself: one round trip registers and publishes, without ``send_task``.
    Otherwise (signing, another broker, Redis Cluster, a redispatch) ``send_task`` publishes.
    """

    def __init__(
        self,
        settings: Settings,
        ledger: Ledger,
        app: Celery,
        writer: str,
        now_ms: Callable[[], int],
        *,
        on_sent: Callable[[dict[str, Any]], None] = _no_event,
    ) -> None:
        self.settings = settings
        self._ledger = ledger
        self._app = app
        self._writer = writer
        self._now_ms = now_ms
        self._on_sent = on_sent
        self.messages = TaskMessages(app, settings.broker.queue) if fast_publish_possible(settings) else None
        # Fixed by the settings per agent (and tool): computed once, not on every call.
        self._restrictions = cache(self._agent_restrictions)
        self._soft_s = lru_cache(maxsize=4096)(settings.tool_timeout_s)
        # What the gateway answers itself goes through the answering service (tools.fallbacks).
        self.answers = Answers(writer=writer, fallbacks=settings.tools.failure_rules().fallbacks)

    def _queue(self, tool: str) -> str:
        """The queue of ``tool``'s calls: the tool queue, or a stateful MCP upstream's own."""
        try:
            upstream = get_tool(tool).stateful_upstream
        except ToolNotFound:  # a redispatch from a process that does not load it: the tool queue
            upstream = None
        base = self.settings.broker.queue
        return base if upstream is None else upstream_queue(base, upstream)

    def _agent_restrictions(self, agent_id: str) -> ToolPolicy | None:
        """``agent_id``'s tool policy, or None when it allows every tool."""
        policy = self.settings.tool_policy(agent_id)
        return policy if policy.restricted else None

    def reject_early(self, call: ToolCall, agent_id: str) -> ToolResult | None:
        """The answer to a call that must not run, or None when it may be dispatched.

        Refused: an unknown tool, a tool ``agent_id`` may not call, invalid or oversized
        arguments. A :class:`RejectedCall` (arguments unreadable in the provider's message)
        is answered ``invalid_arguments`` here too, unless its tool is unknown or not
        allowed, as for any other call.
        """
        size = len(json.dumps(call.arguments, default=str))
        cap = self.settings.limits.max_argument_bytes
        policy = self._restrictions(agent_id)
        try:
            spec = get_tool(call.name)
            if policy is not None and not policy.allows(call.name):
                return not_allowed_result(call, agent_id, elapsed_ms=0, attempt=0)
            if isinstance(call, RejectedCall):
                raise InvalidArguments(call.name, list(call.problems))
            if size > cap:
                raise InvalidArguments(call.name, [f"arguments are {size} bytes; the limit is {cap}"])
            validate_arguments(spec, call.arguments)
        except ToolNotFound as exc:
            # Suggest only tools the agent may call.
            closest = exc.closest if policy is None else policy.filter(exc.closest)
            return rejected_result(call, ToolNotFound(call.name, closest), 0)
        except InvalidArguments as exc:
            return rejected_result(call, exc, 0)
        return None

    def job(
        self, keys: RunKeys, agent_id: str, call: ToolCall, now_ms: int, run_deadline_ms: int | None
    ) -> CallJob:
        """The task message of a valid call, with its limits and deadline."""
        spec = get_tool(call.name)
        limits = resolve_limits(
            now_ms=now_ms,
            soft_s=self._soft_s(agent_id, call.name, spec.soft_timeout_s),
            declared_hard_s=spec.hard_timeout_s,
            heartbeat_s=spec.heartbeat_timeout_s,
            hard_grace_s=self.settings.limits.hard_grace_s,
            queue_allowance_s=self.settings.limits.queue_allowance_s,
            run_deadline_ms=run_deadline_ms,
        )
        return CallJob(
            session_key=keys.session_key,
            run_id=keys.run_id,
            agent_id=agent_id,
            call=call,
            submitted_ms=now_ms,
            deadline_ms=limits.deadline_ms,
            soft_s=limits.soft_s,
            hard_s=limits.hard_s,
            heartbeat_s=limits.heartbeat_s,
        )

    def record_immediate(self, keys: RunKeys, result: ToolResult) -> Immediate:
        """Record a call answered without running; its one answer (the stored one for a known id).

        The registration also tells whether the run's compaction guard is armed: a call answered at
        submission counts for the guard like one that ran.
        """
        fields: dict[str, str] = {
            CallField.TOOL: result.tool_name,
            CallField.IDEMPOTENT: "0",
            CallField.DISPATCHED: "1",
        }
        plan = self.answers.record_immediate(keys, result, now_ms=self._now_ms(), fields=fields)
        return plan.on(self._ledger)

    def plan(
        self,
        keys: RunKeys,
        agent_id: str,
        call: ToolCall,
        now_ms: int,
        run_deadline_ms: int | None,
        *,
        loop_warning: dict[str, Any] | None = None,
    ) -> Submission:
        """The registration of a valid new call: the one entry point of both submitters.

        A ``loop_warning`` rides along in the message, so Flower shows it with the call's task.
        """
        job = self.job(keys, agent_id, call, now_ms, run_deadline_ms)
        options = InvokeOptions.of(job, self._queue(job.call.name))
        json_form = job.model_dump(mode="json")  # once: the message carries it, the digest binds it
        push = self._queued_message(keys, job, json_form, loop_warning, options)
        fields = self._registration_fields(keys, job, json_form)
        return Submission(keys, job, fields, push, options, loop_warning)

    def sent(self, submission: Submission, registration: Registration) -> None:
        """After the register script: publish a new call whose message it did not push, and announce it.

        Nothing is sent for a call that existed or whose run refuses new calls.
        """
        if not registration.created or registration.refused:
            return
        if submission.push is None:
            self.dispatch(submission.keys, submission.job, attempt=0, loop_warning=submission.loop_warning)
        else:
            self._announce_sent(submission.options, submission.task_id)

    def _queued_message(
        self,
        keys: RunKeys,
        job: CallJob,
        json_form: dict[str, Any],
        loop_warning: dict[str, Any] | None,
        options: InvokeOptions,
    ) -> tuple[str, str] | None:
        """The first dispatch's message for the register script to push, or None (``send_task``)."""
        if self.messages is None:
            return None
        message = self.messages.build(
            INVOKE_TASK,
            task_id=task_id(keys, job.call.id, 0),
            kwargs=self._message_kwargs(json_form, loop_warning),
            soft_s=job.soft_s,
            hard_s=job.hard_s,
            shadow=options.label,
            now=datetime.now(tz=UTC),
            headers=tracing.message_headers(keys.session_key, keys.run_id, job.call.id),
            queue=options.queue,
        )
        return broker_queue_key(message.queue), message.payload

    def _registration_fields(self, keys: RunKeys, job: CallJob, json_form: dict[str, Any]) -> dict[str, str]:
        """The call record's fields for a call about to be published (first attempt)."""
        spec = get_tool(job.call.name)
        return {
            CallField.TOOL: job.call.name,
            CallField.AGENT_ID: job.agent_id,
            CallField.IDEMPOTENT: "1" if spec.idempotent else "0",
            CallField.JOB: job.model_dump_json(),
            # What the worker's claim holds the message to: only this exact job may run.
            CallField.JOB_DIGEST: job_digest(json_form),
            # Marked before the publish to save a round trip: if this process dies in
            # between, the call is answered at its deadline instead of at once.
            CallField.DISPATCHED: "1",
            CallField.TASK_ID: task_id(keys, job.call.id, 0),
            **tracing.record_fields(keys.session_key, keys.run_id, job.call.id),
        }

    @staticmethod
    def _message_kwargs(json_form: dict[str, Any], loop_warning: dict[str, Any] | None) -> dict[str, Any]:
        """The invoke task's keyword arguments: the job's JSON form, and a loop warning Flower shows."""
        kwargs: dict[str, Any] = {"job": json_form}
        if loop_warning:
            kwargs["loop_warning"] = loop_warning
        return kwargs

    def _announce_sent(self, options: InvokeOptions, message_id: str) -> None:
        """Hand the published task's ``task-sent`` event to ``on_sent`` (batched for Flower).

        Named after the call, as the worker's events are; no args or kwargs: task-received
        brings them, and a task-sent that reaches Flower last must not replace them.
        """
        self._on_sent(
            {
                "uuid": message_id,
                "name": options.label,
                "retries": 0,
                "expires": options.expires.isoformat(),
                "queue": options.queue,
            }
        )

    def dispatch_failed(self, job: CallJob, exc: Exception) -> ToolResult:
        """The answer to a call whose message the broker did not take (before its fallback)."""
        log.warning("dispatch of %s failed: %s", job.call.id, exc)
        result = synthetic_result(
            job.call,
            SyntheticReason.DISPATCH_FAILED,
            elapsed_ms=self._now_ms() - job.submitted_ms,
            attempt=0,
            detail=f" ({type(exc).__name__})",
        )
        return result

    def dispatch(
        self,
        keys: RunKeys,
        job: CallJob,
        *,
        attempt: int,
        loop_warning: dict[str, Any] | None = None,
        kept: Mapping[str, str] | None = None,
    ) -> ToolResult | None:
        """Publish the call; on failure store ``dispatch_failed`` and return what was handed to the ledger.

        ``kept``: the call's record, whose trace context the message carries when this
        process holds no span of the call.
        """
        message_id = task_id(keys, job.call.id, attempt)
        options = InvokeOptions.of(job, self._queue(job.call.name))
        try:
            self._app.send_task(
                INVOKE_TASK,
                kwargs=self._message_kwargs(job.model_dump(mode="json"), loop_warning),
                task_id=message_id,
                soft_time_limit=job.soft_s,  # type: ignore[arg-type]  # floats work; stubs say int
                time_limit=job.hard_s,  # type: ignore[arg-type]
                expires=options.expires,
                queue=options.queue,
                shadow=options.label,
                ignore_result=True,  # results live in the ledger; skip the backend subscription
                headers=tracing.message_headers(keys.session_key, keys.run_id, job.call.id, kept),
            )
        except Exception as exc:  # noqa: BLE001 - any broker failure means the call cannot run
            given = self.answers.given(self.dispatch_failed(job, exc))
            self.answers.offer(keys, given, now_ms=self._now_ms()).on(self._ledger)
            return given
        self._announce_sent(options, message_id)
        if attempt:
            self._ledger.mark_dispatched(keys, job.call.id, message_id)
        return None

    def redispatch(self, keys: RunKeys, call_id: str) -> None:
        """Publish a call's latest message again, after the ledger counted why.

        A requeue (lost worker) counted itself first, so the message gets the next task id
        (attempt 0 was the first message); a republish (lost message) sends the same message
        under the same task id, so Flower shows one task that ends as the call did.
        """
        record = self._ledger.record(keys, call_id)
        if record is None or CallField.JOB not in record.row:
            return
        job = CallJob.model_validate_json(record.row.text(CallField.JOB))
        tracing.requeued(record.fields, keys.session_key, keys.run_id, job.call, "gateway")
        self.dispatch(keys, job, attempt=record.row.integer(CallField.REQUEUES), kept=record.fields)
