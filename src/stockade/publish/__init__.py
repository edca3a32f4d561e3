"""Publishing: leases with fencing tokens, idempotent effects, and sinks.

The runner calls ``publish()`` once per publish item attempt and records the
item with ``outcome.status``. See ``stockade.publish.core`` for the order of
checks and ``stockade.publish.sink`` for the sink URLs.

Must not import runner, workspace, sandbox or cli.
"""

from __future__ import annotations

from stockade.publish.core import (
    FLAT_SERIES_EVENT,
    LEASE_WAIT_EVENT,
    PublishOutcome,
    PublishRequest,
    check_provenance,
    publish,
)
from stockade.publish.payload import content_sha256, foreign_artifacts
from stockade.publish.sink import Sink, SinkUrlError, Write, WriteResult, open_sink

__all__ = [
    "FLAT_SERIES_EVENT",
    "LEASE_WAIT_EVENT",
    "PublishOutcome",
    "PublishRequest",
    "Sink",
    "SinkUrlError",
    "Write",
    "WriteResult",
    "check_provenance",
    "content_sha256",
    "foreign_artifacts",
    "open_sink",
    "publish",
]
