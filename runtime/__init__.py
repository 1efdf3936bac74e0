"""llm-pool runtime: plain asyncio code that owns models, engines and scheduling.

Nothing in this package imports Django; the Django side talks to it over the
Channels layer (see ``models_app.host.consumer`` and ``models_app.transport.runtime_client``).
"""
