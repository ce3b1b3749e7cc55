"""The engine process of `kvgate serve --workers N`: loads the model once and serves it to the workers.

Run by the supervisor as `python -m gateway.backends.engine_process <plan>`; exits on SIGTERM (requests still
running end as aborted) or when the supervisor dies (PR_SET_PDEATHSIG, set by the supervisor).
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

import torch

from engine import build_engine
from gateway.backends.engine import local_engine_config
from gateway.observability.request_log import configure_logging
from gateway.runtime.process_plan import ProcessPlan
from gateway.runtime.settings import Settings

logger = logging.getLogger("kvgate.engine")


async def serve_engine(settings: Settings, plan: ProcessPlan) -> None:
    from engine import EngineServer  # after logging is configured

    torch.set_num_threads(settings.torch_threads)
    client = await asyncio.to_thread(build_engine, local_engine_config(settings))
    server = EngineServer(client, plan.engine_socket, client.info)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await server.start()
    weights = client.info["weights"]
    logger.info(
        "engine process ready: %s, weights %s (%s)", client.model_name, weights["weights"], weights["reason"]
    )
    await stop.wait()
    await server.close()
    logger.info("engine process stopped")


def main() -> None:
    plan = ProcessPlan.from_json(sys.argv[1])
    settings = Settings()
    configure_logging(settings.log_level, json_lines=settings.log_format == "json")
    asyncio.run(serve_engine(settings, plan))


if __name__ == "__main__":
    main()
