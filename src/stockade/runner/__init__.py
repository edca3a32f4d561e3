"""Running a workflow: the scheduler, attempts, step kinds, executors, the engine.

``scheduler`` decides (pure), ``kinds`` turn an ``Attempt`` into an
``Outcome``, ``executor`` decides where that happens, ``engine`` connects
them to the store and the run folder, ``session`` starts and resumes runs.
Must not import the CLI.
"""
