"""An agent item's page: the conversation, tool calls, each write's target and hash,
token usage, from a real run against the scripted model server."""

from __future__ import annotations

import hashlib
import html
import re
from typing import Any

from modelserver import Call, ModelServer, Seen, Turn, calls, say

from tests.integration.conftest import Project
from tests.web.conftest import UIProcess

NOTE = "Revenue grew 12% in the north."


def script(seen: Seen, n: int) -> Turn:
    if n == 0:
        return calls(Call("read_file", {"path": "region.txt", "offset": None, "limit": None}))
    if n == 1:
        return calls(Call("create_file", {"path": "out/report.md", "content": NOTE + "\n"}))
    return say("report written")


def test_agent_transcript_on_the_item_page(project: Project, start_ui: Any, page: Any) -> None:
    wf = project.write("agent.yaml", """\
        name: agentic
        steps:
          - id: analyse
            inputs:
              region.txt: north
            agent:
              model: openai/scripted-1
              prompt: Read region.txt and write a one-line report to out/report.md.
              tools: [read_file, create_file]
              writes: [out/report.md]
              max_turns: 5
        """)
    with ModelServer(script) as srv:  # type: ignore[arg-type]
        r = project.run("run", str(wf), "--run-id", "agent1", env=srv.env("openai"))
    assert r.code == 0, r.err
    ui: UIProcess = start_ui()
    page.goto(ui.url + "/runs/agent1/analyse/0")
    text = page.inner_text("#transcript")
    # The messages, the tool calls with their arguments, the tool result, the final answer.
    assert "Read region.txt and write a one-line report" in text
    assert "read_file" in text and "create_file" in text and '"path": "out/report.md"' in text
    assert "north" in text and "report written" in text
    # Each write: its target and the sha256 of what was written.
    want = hashlib.sha256((NOTE + "\n").encode()).hexdigest()
    writes = page.inner_text("#writes")
    assert "out/report.md" in writes and want in writes
    # Usage as the scripted provider reported it (prompt 100+n, completion 10+n, three calls).
    assert "input_tokens 303" in text and "output_tokens 33" in text
    # The key never reaches the page.
    body = ui.get("/runs/agent1/analyse/0").text
    assert srv.key not in html.unescape(body)
    assert re.search(r"tokens\s+336", text)
