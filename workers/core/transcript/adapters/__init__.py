"""Provider wire formats <-> the neutral transcript, chosen by format name."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final

from workers.core.transcript.adapters import anthropic, gemini, openai_chat, openai_responses
from workers.core.transcript.adapters.wire import unwrap, wrap
from workers.core.transcript.model import Message
from workers.core.transcript.pairing import IdlessResults
from workers.core.transcript.validate import validate_transcript

__all__ = ["FORMATS", "decode", "default_model_api", "encode", "idless_results"]

_Decoder = Callable[[list[Any], str], list[Message]]
_Encoder = Callable[[list[Message]], list[dict[str, Any]]]

# format -> (envelope key, decoder, encoder, model API implied by the format)
_ADAPTERS: Final[dict[str, tuple[str, _Decoder, _Encoder, str]]] = {
    "anthropic": ("messages", anthropic.to_neutral, anthropic.from_neutral, "anthropic-messages"),
    "openai-chat": ("messages", openai_chat.to_neutral, openai_chat.from_neutral, "openai-completions"),
    "openai-responses": (
        "input",
        openai_responses.to_neutral,
        openai_responses.from_neutral,
        "openai-responses",
    ),
    "gemini": ("contents", gemini.to_neutral, gemini.from_neutral, "google-generative-ai"),
}
FORMATS: Final = ("neutral", *_ADAPTERS)


def decode(fmt: str, document: object) -> list[Message]:
    """The neutral transcript of a document in ``fmt``.

    Raises:
        TranscriptRepairError: the document is malformed; ``path`` points at the problem.
    """
    if fmt == "neutral":
        return validate_transcript(document)
    key, decoder, _, _ = _ADAPTERS[fmt]
    messages, path = unwrap(document, key)
    return decoder(messages, path)


def encode(fmt: str, messages: list[Message], original: object) -> Any:
    """``messages`` in ``fmt``, inside the same envelope ``original`` came in."""
    if fmt == "neutral":
        return messages
    key, _, encoder, _ = _ADAPTERS[fmt]
    return wrap(original, key, encoder(messages))


def default_model_api(fmt: str) -> str | None:
    """The model API a format implies, used for the policy when none is given."""
    return _ADAPTERS[fmt][3] if fmt in _ADAPTERS else None


def idless_results(fmt: str) -> IdlessResults:
    """How pairing treats a result without an id in a transcript decoded from ``fmt``.

    Gemini's responses carry no id by design (its adapter leaves one out where position cannot
    tell), so they are matched by name and keep their kind; anywhere else an id-less result is
    an old OpenClaw session's, and OpenClaw's legacy id fill applies.
    """
    return "by_name" if fmt == "gemini" else "legacy"
