"""Placement: which node (or nodes) a runtime call goes to, and the one answer of several.

The API calls ``placement.call`` (one result) or ``placement.exchange`` (a stream); they read the
pool's view (``models_app.transport.nodes.REGISTRY`` and this process's ``inflight`` bookkeeping),
ask ``decide.place`` where to go, send through ``RuntimeClient`` (one exchange to one channel, or
several at once: ``several``) and merge (``merges``).  Imports go one way: the API -> placement ->
transport.
"""
from models_app.placement.caller import call, exchange

__all__ = ["call", "exchange"]
