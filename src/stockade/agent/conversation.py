"""The host's side of an agent conversation: the messages, and what a reply means.

The broker keeps the conversation (the jail sends only the results of the
tool calls it ran), so each request replays the provider's own assistant
content exactly as it came (``Reply.native``) and each transcript record
holds only what is new since the previous call (``body_delta``).

``verdict`` turns a reply's stop reason into the item's failure: a reply
cut off by the output limit (a cut-off tool call included), a refusal, a
content filter, a full context window, an empty reply. ``missing_outputs``
and ``reminder`` serve the one reminder turn a model gets when it answers
with text but never wrote the step's declared ``outputs``.

The internal message model (plain JSON-ready dicts):

- ``{"role": "system" | "user", "text": str}``
- ``{"role": "assistant", "text": str, "tool_calls": [{"id", "name", "arguments"}],
  "native": <the provider's own content>}``
- ``{"role": "tool", "results": [{"id", "name", "content", "is_error"}]}``

Pure. Standard library only, and ``stockade.agent.wire``.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from typing import Any

from stockade.agent.wire import (
    CONTENT_FILTER,
    CONTEXT_WINDOW,
    LENGTH,
    REFUSAL,
    Message,
    Reply,
)

SYSTEM_PROMPT = """\
You are an agent working inside a sandboxed work directory; every path you use is \
relative to it. Use the tools to read the inputs and to write what the request asks for.
Rules enforced by the engine (a call that breaks one is rejected and does nothing):
- Write tools take no defaults: give every argument explicitly. Unknown or alias \
arguments are errors.
- create_file makes a new file only; apply_patch changes an existing file that the \
request names, with a unified diff.
- Writes are allowed only inside: {writes}.
When you are done, answer with your final message and no tool calls."""

OUTPUTS_RULE = "\n- This step must produce these files under out/: {outputs}. Write them with the tools."


def reminder(missing: list[str], write_tools: Iterable[str]) -> str:
    names = ", ".join(f"out/{m}" for m in missing)
    tools = " or ".join(write_tools) or "the write tools"
    return (f"You answered without writing {names}, which this step must produce. Nothing "
            f"counts until it is written: call {tools} now to write it (paths are relative "
            "to the work directory), then answer with your final message.")


class Conversation:
    def __init__(self, prompt: str, writes: Iterable[str], outputs: Iterable[str] = ()) -> None:
        system = SYSTEM_PROMPT.format(writes=", ".join(writes) or "(nowhere)")
        outs = list(outputs)
        if outs:
            system += OUTPUTS_RULE.format(outputs=", ".join(f"out/{o}" for o in outs))
        self.messages: list[Message] = [{"role": "system", "text": system},
                                        {"role": "user", "text": prompt}]
        #: ids of the tool calls the next results must answer, in order
        self.pending: list[str] = []

    def add_reply(self, reply: Reply) -> None:
        self.messages.append({
            "role": "assistant", "text": reply.text,
            "tool_calls": [dict(c) for c in reply.tool_calls], "native": reply.native,
        })
        self.pending = [c["id"] for c in reply.tool_calls]

    def add_results(self, results: Any) -> str | None:
        """Append the jail's tool results; an error text if they do not answer the calls."""
        if not isinstance(results, list) or not all(isinstance(r, dict) for r in results):
            return "results must be a list of objects"
        ids = [str(r.get("id")) for r in results]
        if not ids and not self.pending:
            return None  # the first call: no tool ran yet
        if ids != self.pending:
            return f"results answer {ids}, the model's calls were {self.pending}"
        self.messages.append({"role": "tool", "results": [
            {"id": str(r["id"]), "name": str(r.get("name") or ""), "content": str(r.get("content") or ""),
             "is_error": bool(r.get("is_error"))}
            for r in results
        ]})
        self.pending = []
        return None

    def add_user(self, text: str) -> None:
        self.messages.append({"role": "user", "text": text})


def verdict(reply: Reply, max_tokens: int | None) -> str | None:
    """Why a reply fails the item, or None when the loop may go on with it."""
    raw = f" (stop reason {reply.stop_raw})" if reply.stop_raw else ""
    if reply.stop == LENGTH:
        limit = f"max_tokens {max_tokens}" if max_tokens else "the provider's default limit"
        what = "a tool call was cut off" if reply.tool_calls else "the reply is incomplete"
        return (f"the model stopped at its output limit{raw}, {limit}: {what}; raise "
                "params.max_tokens or ask for shorter steps")
    if reply.stop == REFUSAL:
        said = (reply.refusal or reply.text).strip()
        return f"the model refused{raw}" + (f": {said[:300]}" if said else "")
    if reply.stop == CONTENT_FILTER:
        return f"the provider's content filter stopped the reply{raw}"
    if reply.stop == CONTEXT_WINDOW:
        return (f"the conversation no longer fits the model's context window{raw}; give the "
                "step smaller inputs or fewer turns")
    if not reply.tool_calls and not reply.text.strip():
        return f"the model returned an empty reply{raw}"
    return None


def missing_outputs(patterns: Iterable[str], written: Iterable[str]) -> list[str]:
    """Declared ``outputs`` (relative to out/) that no tool-written file matches."""
    names = [w.removeprefix("out/") for w in written if w.startswith("out/")]
    return [p for p in patterns if not any(fnmatch.fnmatchcase(n, p) for n in names)]


def body_delta(prev: dict[str, Any] | None, body: dict[str, Any], key: str) -> dict[str, Any]:
    """What a transcript keeps of ``body``: the conversation items new since ``prev``
    (``key`` is ``messages`` or ``input``) and the other fields that changed."""
    if prev is None:
        return dict(body)
    old, new = prev.get(key) or [], body.get(key) or []
    start = 0
    while start < min(len(old), len(new)) and old[start] == new[start]:
        start += 1
    out: dict[str, Any] = {k: v for k, v in body.items() if k != key and prev.get(k) != v}
    out.update({f"{key}_from": start, key: new[start:]})
    gone = sorted(k for k in prev if k not in body)
    if gone:
        out["removed"] = gone
    return out
