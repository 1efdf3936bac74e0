"""Run the runtime side: start the runtime, then serve this node's runtime channel.

Embedded (``serve``): the plain ``llmpool-runtime`` channel.  Split (``runtime``): the node's own,
``llmpool-runtime.<node>``, and the node announces itself in the pool's registry while it serves
(``models_app.host.announcer``).  The channel's messages go straight to the runtime consumer's
handlers (``consumer.serve_channel``), not through Channels' worker and an application instance.
"""
import logging

from channels.layers import get_channel_layer
from django.conf import settings

from models_app.host import runtime_host
from models_app.host.announcer import NodeAnnouncer
from models_app.host.consumer import serve_channel
from models_app.transport import nodes

logger = logging.getLogger("llmpool.runtime")


async def run_runtime_worker() -> None:
    announcer = None
    try:
        service = await runtime_host.ensure_runtime()
        if nodes.is_split():
            announcer = NodeAnnouncer(settings.REDIS_URL, nodes.prefix(), nodes.this_node(), service)
            service.reload_listeners.append(announcer.after_reload)
            await announcer.start()
        channel = nodes.own_channel()
        logger.info("serving channel %s", channel)
        await serve_channel(channel, get_channel_layer())
    except Exception:
        logger.exception("the runtime worker stopped")
        raise
    finally:
        if announcer is not None:
            await announcer.stop()
