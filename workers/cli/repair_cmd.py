"""``unstuck repair``: repair a transcript file (or stdin) and write it to stdout in its own format."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, TextIO

from workers.core.transcript import (
    DEFAULT_MISSING_TEXT,
    RepairReport,
    TranscriptPolicy,
    repair_pairing,
    repair_transcript,
    resolve_policy,
    sanitize_tool_call_ids,
    sanitize_tool_call_inputs,
)
from workers.core.transcript.adapters import FORMATS, decode, default_model_api, encode, idless_results
from workers.errors import ConfigError, TranscriptRepairError

__all__ = ["register"]


def register(subparsers: Any) -> None:
    """Add the ``repair`` sub-command."""
    parser = subparsers.add_parser("repair", help="repair tool call/result pairing of a transcript")
    parser.add_argument("file", nargs="?", default="-", help="transcript JSON file, or - for stdin")
    parser.add_argument("--format", choices=FORMATS, default="neutral", help="transcript format")
    parser.add_argument("--provider", help="provider whose policy drives the full pipeline")
    parser.add_argument("--model-api", help="model API (default: implied by --format)")
    parser.add_argument("--model-id", help="model id, e.g. mistral-large")
    parser.add_argument("--step", choices=("pairing", "inputs", "ids"), help="run one stage only")
    parser.add_argument("--errored-turns", choices=("preserve", "drop"), help="errored/aborted turns")
    parser.add_argument("--missing-text", help="text of synthetic results for missing ones")
    parser.add_argument("--allowed-tools", help="comma-separated allowed tool names")
    parser.add_argument("--id-mode", choices=("strict", "strict9", "responses"), help="tool-call id form")
    parser.add_argument("--strip-details", action="store_true", help="remove result details")
    parser.add_argument("--report", action="store_true", help="write the report to stderr as JSON")
    parser.add_argument("--policy", action="store_true", help="print the resolved policy and exit")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the command; returns the exit code (2 for malformed input or options)."""
    try:
        policy = _policy(args)
        if args.policy:
            _write_json(sys.stdout, policy.model_dump(mode="json"))
            return 0
        document = _read_json(args.file)
        messages = decode(args.format, document)
        repaired, report = _repair(args, messages, policy)
        output = encode(args.format, repaired, document)
    except (TranscriptRepairError, ConfigError) as error:
        print(f"unstuck repair: {_one_line(error)}", file=sys.stderr)
        return 2
    _write_json(sys.stdout, output)
    if args.report:
        _write_json(sys.stderr, report)
    return 0


def _policy(args: argparse.Namespace) -> TranscriptPolicy:
    overrides: dict[str, Any] = {}
    if args.errored_turns:
        overrides["errored_turns"] = args.errored_turns
    if args.missing_text is not None:
        overrides["missing_tool_result_text"] = args.missing_text
    if args.id_mode:
        overrides |= {"sanitize_tool_call_ids": True, "tool_call_id_mode": args.id_mode}
    model_api = args.model_api or default_model_api(args.format)
    return resolve_policy(args.provider, model_api, args.model_id, overrides)


def _repair(
    args: argparse.Namespace, messages: list[Any], policy: TranscriptPolicy
) -> tuple[list[Any], dict[str, Any]]:
    allowed = [name for name in (args.allowed_tools or "").split(",") if name.strip()]
    if args.step == "inputs":
        inputs = sanitize_tool_call_inputs(messages, allowed_tool_names=allowed)
        return inputs.messages, inputs.report.to_json()
    if args.step == "ids":
        ids = sanitize_tool_call_ids(messages, args.id_mode or "strict")
        return ids.messages, ids.report.to_json()
    if args.step == "pairing":
        paired = repair_pairing(
            messages,
            errored_turns=args.errored_turns or "preserve",
            missing_text=DEFAULT_MISSING_TEXT if args.missing_text is None else args.missing_text,
            idless=idless_results(args.format),
        )
        return paired.messages, paired.report.to_json()
    full = repair_transcript(
        messages,
        policy,
        allowed_tool_names=allowed,
        strip_details=args.strip_details,
        idless=idless_results(args.format),
    )
    report: RepairReport = full.report
    return full.messages, report.to_json()


def _read_json(file: str) -> Any:
    try:
        if file == "-":
            text = sys.stdin.read()
        else:
            with open(file, encoding="utf-8") as handle:
                text = handle.read()
    except (OSError, UnicodeDecodeError) as error:
        raise TranscriptRepairError("$", f"cannot read {file}: {error}") from error
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise TranscriptRepairError(
            "$", f"invalid JSON at line {error.lineno} column {error.colno}"
        ) from error
    except RecursionError:
        raise TranscriptRepairError("$", "JSON nested too deeply") from None


def _write_json(stream: TextIO, value: Any) -> None:
    stream.write(json.dumps(value, ensure_ascii=False, indent=2) + "\n")


def _one_line(error: Exception) -> str:
    return " ".join(str(error).split())
