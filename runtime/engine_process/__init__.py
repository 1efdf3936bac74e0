"""Engine processes: an in-process engine hosted in a child process of its own.

``ProcessEngine`` (runtime side, ``engine``) starts ``python -m
runtime.engine_process.child`` through the supervisor and talks to it over a
Unix socket with the frames of ``protocol``; ``child`` builds the backend's
engine there with ``spec.create_engine``.  A native fault then kills that one
process, and the runtime fails that model alone.
"""
