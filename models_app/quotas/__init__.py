"""The API process's per-key limits and usage: what a key of the database may still use, and what it used.

``admission`` admits each request of a database key at the edge (requests and tokens per minute,
concurrent requests, a token budget per day or month) and charges it the engine's real token
counts; ``policy`` holds the limits, the verdicts and the budget periods (pure); ``memory_store``
keeps the counters of the embedded default, ``redis_store`` those of the split (shared by every
API process, one atomic script per admission); ``usage`` writes the tokens per key, model and day
to the database in batches, from a task of the API process's own event loop.
"""
