"""Load and validate workflow files; the JSON Schema of the format.

Pure: takes bytes, returns a ``Spec`` or raises ``UserError`` with every
problem as ``FILE:LINE:COL: message``. Imports ``stockade.expr`` and
``stockade.errors`` only.

Must not import workspace, sandbox, runner, agent, publish, store, web or cli.
"""

from stockade.spec.load import Spec, load_workflow
from stockade.spec.schema import json_schema

__all__ = ["Spec", "json_schema", "load_workflow"]
