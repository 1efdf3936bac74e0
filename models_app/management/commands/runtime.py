"""``manage.py runtime``: the runtime worker alone (production split over Redis).

It takes the node's runtime lock, starts the runtime (enabled models load in
the background) and serves the ``llmpool-runtime`` channel until SIGTERM,
then releases every engine and the lock.  API processes run separately:
``manage.py api`` (uvicorn; ``--server daphne``).
"""
import asyncio
import signal
import sys
from urllib.parse import urlsplit

from django.conf import settings
from django.core.management.base import BaseCommand

from models_app import diagnostics
from models_app.conf import require_redis, startup_migrate, startup_service_settings


class Command(BaseCommand):
    help = "Run the llm-pool runtime worker alone (needs LLMPOOL_REDIS_URL)."

    def handle(self, *args, **options):
        require_redis(self.stderr, "the runtime worker runs alone")
        diagnostics.install()
        startup_service_settings(self.stderr)
        startup_migrate(self.stderr)
        sys.exit(asyncio.run(self.run_worker()))

    async def run_worker(self) -> int:
        from models_app.host import runtime_host
        from models_app.host.lock import RuntimeAlreadyRunning, RuntimeOwnerLock
        from models_app.host.tasks import cancel_and_wait, cancel_the_rest
        from models_app.host.worker import run_runtime_worker
        from models_app.transport import nodes
        from models_app.transport.channel_layer import REDIS_DOWN

        prefix = settings.CHANNEL_LAYERS["default"]["CONFIG"]["prefix"]
        # The node's name as its channel and registry entry carry it (LLMPOOL_NODE_ID sanitised).
        lock = RuntimeOwnerLock(settings.REDIS_URL, prefix, nodes.this_node())
        try:
            await lock.acquire()
        except RuntimeAlreadyRunning as exc:
            self.stderr.write(f"runtime_already_running: {exc}")
            return 3
        except REDIS_DOWN as exc:
            await lock.redis.aclose()
            where = urlsplit(settings.REDIS_URL)
            self.stderr.write(f"runtime_unavailable: cannot reach Redis at {where.hostname}:{where.port or 6379} "
                              f"(LLMPOOL_REDIS_URL): {exc}")
            return 2
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        worker = asyncio.create_task(run_runtime_worker())
        self.stdout.write(f"llm-pool runtime worker for node {nodes.this_node()} started")
        self.stdout.flush()
        waiters = [asyncio.create_task(stop.wait()), asyncio.create_task(lock.lost.wait()), worker]
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        with diagnostics.stacks_if_slow():
            await cancel_and_wait(waiters)  # a cancel a library drops is sent again (models_app.host.tasks)
            await runtime_host.shutdown_runtime()
            await lock.release()
            await cancel_the_rest()
        crashed = worker.done() and not worker.cancelled() and worker.exception() is not None
        return 1 if lock.lost.is_set() or crashed else 0
