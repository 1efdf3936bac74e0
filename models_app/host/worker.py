"""Run the runtime side: start the runtime, then serve the ``llmpool-runtime`` channel."""
import logging

from channels.layers import get_channel_layer
from channels.worker import Worker

from models_app.host import runtime_host
from models_app.transport.messages import RUNTIME_CHANNEL

logger = logging.getLogger("llmpool.runtime")


async def run_runtime_worker(application) -> None:
    try:
        await runtime_host.ensure_runtime()
        await Worker(application=application, channels=[RUNTIME_CHANNEL], channel_layer=get_channel_layer()).arun()
    except Exception:
        logger.exception("the runtime worker stopped")
        raise
