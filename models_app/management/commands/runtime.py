"""``manage.py runtime``: the runtime worker alone (production split over Redis).

It takes the node's runtime lock, starts the runtime (enabled models load in
the background) and serves the ``llmpool-runtime`` channel until SIGTERM,
then releases every engine and the lock.  API processes run separately:
``daphne llmpool.asgi:application``.
"""
import asyncio
import signal
import sys

from django.conf import settings
from django.core.management import call_command
from django.core.management.base import BaseCommand

from models_app.conf import startup_service_settings



class Command(BaseCommand):
    help = "Run the llm-pool runtime worker alone (needs LLMPOOL_REDIS_URL)."

    def handle(self, *args, **options):
        if not settings.REDIS_URL:
            self.stderr.write(
                "runtime_unavailable: the runtime worker runs alone only over Redis; set LLMPOOL_REDIS_URL "
                "(the embedded default runs everything with `manage.py serve`)"
            )
            sys.exit(2)
        startup_service_settings(self.stderr)
        call_command("migrate", interactive=False, verbosity=0)
        sys.exit(asyncio.run(self.run_worker()))

    async def run_worker(self) -> int:
        from llmpool.asgi import application
        from models_app.host import runtime_host
        from models_app.host.lock import RuntimeAlreadyRunning, RuntimeOwnerLock
        from models_app.host.worker import run_runtime_worker

        prefix = settings.CHANNEL_LAYERS["default"]["CONFIG"]["prefix"]
        lock = RuntimeOwnerLock(settings.REDIS_URL, prefix, settings.LLMPOOL_NODE_ID)
        try:
            await lock.acquire()
        except RuntimeAlreadyRunning as exc:
            self.stderr.write(f"runtime_already_running: {exc}")
            return 3
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        worker = asyncio.create_task(run_runtime_worker(application))
        self.stdout.write(f"llm-pool runtime worker for node {settings.LLMPOOL_NODE_ID} started")
        self.stdout.flush()
        waiters = [asyncio.create_task(stop.wait()), asyncio.create_task(lock.lost.wait()), worker]
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
        for task in waiters:
            task.cancel()
        await asyncio.gather(*waiters, return_exceptions=True)
        await runtime_host.shutdown_runtime()
        await lock.release()
        crashed = worker.done() and not worker.cancelled() and worker.exception() is not None
        return 1 if lock.lost.is_set() or crashed else 0
