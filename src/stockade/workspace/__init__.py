"""Run and item directories, the manifest, artifacts and their provenance.

This layer owns every path under ``<root>/runs/<run_id>/``. It must not import
the runner, the sandbox backends or the CLI.
"""
