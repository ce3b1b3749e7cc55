"""One HTTP worker of `kvgate serve --workers N`: the whole cache path, on the supervisor's listening socket.

Run by the supervisor as `python -m gateway.http.worker_process <plan>`. uvicorn drains on SIGTERM: it stops
accepting, finishes the requests it has (streams included), then runs the app's shutdown.
"""

from __future__ import annotations

import socket
import sys

from gateway.http.app import create_app
from gateway.http.server import run_http
from gateway.observability.request_log import configure_logging
from gateway.runtime.process_plan import ProcessPlan
from gateway.runtime.settings import Settings


def main() -> None:
    plan = ProcessPlan.from_json(sys.argv[1])
    overrides = {key: value for key, value in {"host": plan.host, "port": plan.port}.items() if value}
    settings = Settings().model_copy(update=overrides)
    configure_logging(settings.log_level, json_lines=settings.log_format == "json")
    assert plan.listen_fd is not None, "a worker needs the supervisor's listening socket"
    listener = socket.socket(fileno=plan.listen_fd)
    run_http(create_app(settings, plan=plan), settings, sockets=[listener])


if __name__ == "__main__":
    main()
