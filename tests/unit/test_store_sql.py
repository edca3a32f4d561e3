"""``store._sql.to_postgres``: the shared reads, spelt for PostgreSQL. Pure."""

from __future__ import annotations

import re

import pytest

from stockade.store import _sqlite_file, pg_schema
from stockade.store._sql import TABLES, to_postgres


@pytest.mark.parametrize(
    ("sqlite", "postgres"),
    [
        ("SELECT * FROM runs WHERE run_id=?", "SELECT * FROM stockade_runs WHERE run_id=%s"),
        ("SELECT x.key FROM reuse_index x JOIN runs r ON r.run_id = x.run_id WHERE x.key=?",
         "SELECT x.key FROM stockade_reuse_index x JOIN stockade_runs r ON r.run_id = x.run_id"
         " WHERE x.key=%s"),
        ("SELECT lease FROM last_publish WHERE lease = ?",
         "SELECT lease FROM stockade_last_publish WHERE lease = %s"),
        # Only table names after FROM or JOIN: columns and longer names stay.
        ("SELECT items, runs_total FROM itemsx WHERE items=?",
         "SELECT items, runs_total FROM itemsx WHERE items=%s"),
        # A literal % is doubled for psycopg, placeholders or not.
        ("SELECT * FROM runs WHERE run_id LIKE 'a%' AND status=?",
         "SELECT * FROM stockade_runs WHERE run_id LIKE 'a%%' AND status=%s"),
        ("SELECT * FROM runs WHERE run_id LIKE ? ESCAPE '\\' LIMIT ?",
         "SELECT * FROM stockade_runs WHERE run_id LIKE %s ESCAPE '\\' LIMIT %s"),
        ("SELECT step FROM\n  items WHERE run_id = ANY(?)",
         "SELECT step FROM\n  stockade_items WHERE run_id = ANY(%s)"),
    ],
)
def test_spelt_for_postgres(sqlite: str, postgres: str) -> None:
    assert to_postgres(sqlite) == postgres


def test_a_question_mark_in_a_literal_is_refused() -> None:
    with pytest.raises(ValueError, match="string literal"):
        to_postgres("SELECT * FROM runs WHERE message = '?'")


def test_every_table_of_both_schemas_is_known() -> None:
    # A shared read of a table missing from TABLES would reach PostgreSQL
    # without its prefix.
    made = re.compile(r"CREATE TABLE IF NOT EXISTS (\w+)")
    assert sorted(made.findall(_sqlite_file.SCHEMA)) == sorted(TABLES)
    assert sorted(made.findall(pg_schema.SCHEMA)) == sorted(f"stockade_{t}" for t in TABLES)
