"""Transcript repair: neutral model, provider adapters, sanitisation, pairing and policy."""

from workers.core.transcript.ids import IdMode, SanitizedIds, sanitize_tool_call_id, sanitize_tool_call_ids
from workers.core.transcript.model import (
    DEFAULT_MISSING_TEXT,
    MISSING_RESULT_REASON,
    Message,
    ResultLookup,
    is_synthetic,
    make_synthetic_result,
)
from workers.core.transcript.pairing import ErroredTurns, PairingResult, repair_pairing
from workers.core.transcript.pipeline import RepairedTranscript, repair_transcript
from workers.core.transcript.policy import TranscriptPolicy, resolve_policy
from workers.core.transcript.report import IdReport, InputReport, PairingReport, RepairReport
from workers.core.transcript.sanitize import (
    SanitizedInputs,
    StrippedDetails,
    sanitize_tool_call_inputs,
    strip_result_details,
)
from workers.core.transcript.validate import validate_transcript

__all__ = [
    "DEFAULT_MISSING_TEXT",
    "MISSING_RESULT_REASON",
    "ErroredTurns",
    "IdMode",
    "IdReport",
    "InputReport",
    "Message",
    "PairingReport",
    "PairingResult",
    "RepairReport",
    "RepairedTranscript",
    "ResultLookup",
    "SanitizedIds",
    "SanitizedInputs",
    "StrippedDetails",
    "TranscriptPolicy",
    "is_synthetic",
    "make_synthetic_result",
    "repair_pairing",
    "repair_transcript",
    "resolve_policy",
    "sanitize_tool_call_id",
    "sanitize_tool_call_ids",
    "sanitize_tool_call_inputs",
    "strip_result_details",
    "validate_transcript",
]
