"""Engine processes: an in-process engine hosted in a child process of its own.

``ProcessEngine`` (runtime side, ``engine``) takes a warm spare engine process of
its backend (``spares``) or starts ``python -m runtime.engine_process.child``
through the supervisor (``launch``), and talks to it over a Unix socket with the
frames of ``protocol``; ``child`` builds the backend's engine there with
``spec.create_engine``.  A native fault then kills that one process, and the
runtime fails that model alone.
"""
