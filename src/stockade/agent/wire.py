"""Provider wire formats: what is sent to a model and what comes back, per provider.

Translates the host conversation (see ``stockade.agent.conversation``) into a
provider request body, and a provider response body back into a ``Reply``:
text, tool calls, normalised stop reason, token usage and the provider's own
assistant content to replay on the next turn (thinking blocks, reasoning
items, tool arguments repaired into valid JSON).

Four providers: ``openai`` (chat completions, any compatible server),
``openai-responses`` (the Responses API), ``azure`` (chat completions on a
classic Azure deployment URL) and ``anthropic`` (messages). The formats live
in ``wire_chat``, ``wire_responses`` and ``wire_anthropic``; this module
holds what they share and dispatches. What each model accepts (no
``parallel_tool_calls`` or ``temperature`` for o-series, ``strict`` tools
only for Claude 4.5 and later) is decided here, from the model name, and
``omit`` carries the optional fields a server rejected at run time.

Pure: the broker does the HTTP. Standard library only, and the
provider modules it dispatches to (``stockade.agent.wire_chat``,
``stockade.agent.wire_responses``, ``stockade.agent.wire_anthropic``).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

PROVIDERS = ("openai", "openai-responses", "azure", "anthropic")

Message = dict[str, Any]


class WireError(ValueError):
    """A provider response that does not have the documented shape."""


@dataclass(frozen=True)
class Usage:
    """Tokens of one call. ``input_tokens`` includes the cached ones; ``output_tokens``
    includes the reasoning ones (as every provider bills them)."""

    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    reasoning_tokens: int = 0
    #: counts the provider sent that were not counts (see ``Tally``), for the transcript
    notes: tuple[str, ...] = ()

    def as_dict(self) -> dict[str, int]:
        return {
            "input_tokens": self.input_tokens, "output_tokens": self.output_tokens,
            "cached_tokens": self.cached_tokens, "reasoning_tokens": self.reasoning_tokens,
        }

    @property
    def total(self) -> int:
        return self.input_tokens + self.output_tokens


#: Normalised stop reasons.
END, TOOL_USE, LENGTH, REFUSAL, CONTENT_FILTER, CONTEXT_WINDOW, OTHER = (
    "end", "tool_use", "length", "refusal", "content_filter", "context_window", "other")


@dataclass(frozen=True)
class Reply:
    text: str
    tool_calls: tuple[dict[str, str], ...]  # {"id", "name", "arguments"} as the model wrote them
    usage: Usage
    #: one of END, TOOL_USE, LENGTH, REFUSAL, CONTENT_FILTER, CONTEXT_WINDOW, OTHER
    stop: str
    #: the provider's own word for it (``finish_reason``, ``stop_reason``, ``status``)
    stop_raw: str = ""
    refusal: str = ""
    #: the provider's assistant content, to replay as it came on the next request
    native: Any = None


@dataclass(frozen=True)
class Settings:
    """The step's ``params``, as the wire builders read them."""

    max_tokens: int | None = None
    temperature: float | None = None
    reasoning_effort: str | None = None
    tool_choice: str | None = None
    thinking: Mapping[str, Any] | None = None


@dataclass
class Built:
    body: dict[str, Any]
    #: what was left out or renamed for this model, and why (recorded once)
    notes: list[str] = field(default_factory=list)


def split_model(spec: str) -> tuple[str, str]:
    """``openai/gpt-4.1-mini`` -> (``openai``, ``gpt-4.1-mini``)."""
    provider, sep, model = spec.partition("/")
    if not sep or provider not in PROVIDERS or not model:
        raise ValueError(f"model must be provider/name with provider one of {PROVIDERS}: {spec!r}")
    return provider, model


# -- what each model accepts ----------------------------------------------------


def _base_name(model: str) -> str:
    # LiteLLM and other proxies name models "openai/o3-mini" or "azure/o1".
    return model.rsplit("/", 1)[-1].lower()


def o_series(model: str) -> bool:
    """o1, o3, o4-mini, ...: reject ``parallel_tool_calls`` and ``temperature``."""
    return re.match(r"^o\d", _base_name(model)) is not None


def reasoning_model(model: str) -> bool:
    """Models that take ``max_completion_tokens`` and only the default temperature."""
    name = _base_name(model)
    return o_series(model) or (name.startswith("gpt-5") and "chat" not in name)


def claude_version(model: str) -> tuple[int, int] | None:
    """(major, minor) of a Claude model name, old (claude-3-5-sonnet) or new (claude-sonnet-4-5)."""
    name = _base_name(model)
    m = re.match(r"^claude-(?:[a-z]+-)?(\d+)(?:[-.](\d{1,2}))?(?=$|[-.@])", name)
    if m is None:
        return None
    return int(m.group(1)), int(m.group(2) or 0)


def anthropic_strict(model: str) -> bool:
    """Strict tool schemas: Claude 4.5 and later take ``strict``; earlier ones answer 400."""
    v = claude_version(model)
    return v is not None and v >= (4, 5)


# -- tool arguments -------------------------------------------------------------


def arguments_object(arguments: Any) -> dict[str, Any]:
    """A tool call's arguments as a JSON object; anything malformed becomes ``{}``.

    Replayed history must be valid JSON: Ollama and older vLLM parse the
    arguments of earlier turns and reject the whole request otherwise. The
    jail still gets the raw text, so the model is told what was wrong.
    """
    if isinstance(arguments, dict):
        return arguments
    if isinstance(arguments, str):
        try:
            value = json.loads(arguments)
        except (json.JSONDecodeError, RecursionError):
            return {}
        return value if isinstance(value, dict) else {}
    return {}


def arguments_json(arguments: Any) -> str:
    """The arguments as JSON text that parses to an object (for replay): the
    model's own text when it is one, else the repaired object."""
    if _parses(arguments):
        assert isinstance(arguments, str)
        return arguments
    return json.dumps(arguments_object(arguments), ensure_ascii=False)


def _parses(text: Any) -> bool:
    if not isinstance(text, str):
        return False
    try:
        return isinstance(json.loads(text), dict)
    except (json.JSONDecodeError, RecursionError):
        return False


def raw_arguments(arguments: Any) -> str:
    """The arguments as the jail gets them: the model's text, or JSON for an object."""
    if isinstance(arguments, str):
        return arguments
    return json.dumps(arguments if arguments is not None else {}, ensure_ascii=False)


def unique_ids(ids: list[str], prefix: str) -> list[str]:
    """Tool call ids, with missing or repeated ones (some servers send none) made unique."""
    out: list[str] = []
    for i, raw in enumerate(ids):
        cid = raw or f"{prefix}_{i}"
        while cid in out:
            cid = f"{cid}_{i}"
        out.append(cid)
    return out


def kind_of(value: Any) -> str:
    """``null``, ``a string``, ``a list``...: what a value is, in a message."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    return {str: "a string", list: "a list", dict: "an object", int: "a number",
            float: "a number"}.get(type(value), type(value).__name__)


def num(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


class Tally:
    """Token counts read from a provider's ``usage`` object.

    A count that is not a whole number >= 0 (``-5``, ``"12"``, ``true``)
    counts as 0 and leaves a note for the transcript. Not an error: the
    reply itself is fine and failing the item over a proxy's bookkeeping
    would lose the work; but a negative count must never give tokens back
    to the budget, nor may a bad one pass unseen. A missing count is 0
    without a note (many servers leave out the details).
    """

    def __init__(self, usage: Any) -> None:
        self.notes: list[str] = []
        self._usage = usage if isinstance(usage, dict) else {}
        if usage is not None and not isinstance(usage, dict):
            self.notes.append(f"usage was {_brief(usage)}, not an object; its counts are taken as 0")

    def get(self, *path: str) -> int:
        value: Any = self._usage
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        if value is None:
            return 0
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            return value
        self.notes.append(f"usage.{'.'.join(path)} was {_brief(value)}, not a count of tokens; "
                          "counted as 0")
        return 0


def _brief(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=str)
    return text if len(text) <= 40 else text[:40] + "..."


# -- dispatch -------------------------------------------------------------------


def build_request(provider: str, model: str, messages: list[Message], tools: list[str],
                  settings: Settings | None = None, omit: frozenset[str] = frozenset()) -> Built:
    s = settings or Settings()
    if provider in ("openai", "azure"):
        from stockade.agent import wire_chat

        return wire_chat.build(model, messages, tools, s, omit)
    if provider == "openai-responses":
        from stockade.agent import wire_responses

        return wire_responses.build(model, messages, tools, s, omit)
    if provider == "anthropic":
        from stockade.agent import wire_anthropic

        return wire_anthropic.build(model, messages, tools, s, omit)
    raise ValueError(f"unknown provider {provider!r}")


def parse_response(provider: str, body: Any) -> Reply:
    if not isinstance(body, dict):
        raise WireError(f"the provider answered {kind_of(body)}, not a JSON object")
    if provider in ("openai", "azure"):
        from stockade.agent import wire_chat

        return wire_chat.parse(body)
    if provider == "openai-responses":
        from stockade.agent import wire_responses

        return wire_responses.parse(body)
    from stockade.agent import wire_anthropic

    return wire_anthropic.parse(body)


#: The key in a request body holding the conversation (recorded as deltas).
CONVERSATION_KEY = {"openai": "messages", "azure": "messages", "anthropic": "messages",
                    "openai-responses": "input"}
