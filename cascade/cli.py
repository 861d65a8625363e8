"""The ``cascade`` command.

cascade pipelines [--json | --markdown | --write | --check]
cascade step NAME [--pipeline PIPELINE] --ds YYYY-MM-DD
cascade land DATASET [PATH] --ds YYYY-MM-DD [--format FORMAT | --source NAME] [--replace]
cascade score --model MODEL [--user ID --items ID ... | --audio FILE.wav]
cascade rollback --model MODEL [--reason TEXT] [--expect-version V]
cascade events publish cascade.data.landed --dataset impressions --partition 2026-11-22
cascade events dead-letters
cascade version [--json]
cascade up | down | status | demo | bench ...   (commands registered by other packages)
cascade ctr | asr | multimodal ACTION ...   cascade ui-check ...   (modules run as a process)

Exit codes: 0 done; 1 the action ran and failed (a step, a gate, a benchmark); 2 usage (a bad
option or value); 3 not ready (a service is down, an input a step needs does not exist yet).
Errors are one line with the fix; ``cascade --debug ...`` shows the traceback.

Pipelines, their steps and their registered models come from the pipeline registry
(:mod:`cascade.pipeline_registry`); more commands come from the ``cascade.commands`` entry-point
group (each entry point is ``register(subparsers) -> error types``), so this module imports
nothing above the kernel.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import sys
import textwrap
from pathlib import Path
from typing import Any

from cascade.assets import TOPIC_DATA_LANDED
from cascade.config import REPO_ROOT, load_settings
from cascade.errors import NotReady, UsageError
from cascade.pipeline_registry import registered_models, registered_pipelines

COMMANDS_GROUP = "cascade.commands"
SCORE_FIELDS = ("user", "items", "audio")
"""The request fields of ``cascade score`` (a model's ``score_needs`` names the ones it needs)."""
EXIT_FAILED, EXIT_USAGE, EXIT_NOT_READY = 1, 2, 3


NOT_READY_NAMES = frozenset(
    {"NoBrokersAvailable", "KafkaConnectionError", "TrackingUnavailable", "StackNotRunning"}
)
"""Exception type names (of packages the kernel does not import) that mean "not ready"."""


def exit_code(exc: BaseException) -> int:
    """The exit code of an error that ended a command (see the module docstring)."""
    names = {cls.__name__ for cls in type(exc).__mro__}
    if isinstance(exc, NotReady | FileNotFoundError | ConnectionError | TimeoutError):
        return EXIT_NOT_READY
    if names & NOT_READY_NAMES or "ConnectionError" in names:  # requests, urllib3, kafka
        return EXIT_NOT_READY
    if isinstance(exc, UsageError):
        return EXIT_USAGE
    from cascade.events import InvalidEvent

    if isinstance(exc, InvalidEvent):
        return EXIT_USAGE
    return EXIT_FAILED


def one_line(exc: BaseException) -> str:
    """The error as one line: its message, or its type when the message is empty."""
    text = " ".join(str(exc).split())
    return text if text else type(exc).__name__


def cmd_publish(args: argparse.Namespace) -> int:
    from cascade.broker import publish
    from cascade.events import make_event

    payload: dict[str, Any] = json.loads(args.payload) if args.payload else {}
    if args.dataset:
        payload["dataset"] = args.dataset
    if args.partition:
        payload["partition"] = args.partition
    event = make_event(args.type, payload)
    if event.type == TOPIC_DATA_LANDED:
        _check_listened(event)
    print(json.dumps(publish(event)))
    return 0


def listened_datasets() -> dict[str, list[str]]:
    """Dataset -> the registered pipelines whose trigger selects its ``cascade.data.landed``."""
    from cascade.event_trigger import parse_selector

    listened: dict[str, list[str]] = {}
    for name, spec in registered_pipelines().items():
        for selector in map(parse_selector, spec.trigger.selectors if spec.trigger else ()):
            if selector.event_type == TOPIC_DATA_LANDED and selector.field == "dataset":
                listened.setdefault(str(selector.value), []).append(name)
    return listened


def _check_listened(event: Any) -> None:
    """Refuse a landed event that no registered pipeline's trigger selects: it would start
    nothing."""
    from cascade.event_trigger import event_matches

    specs = registered_pipelines().values()
    if any(spec.trigger and event_matches(event, spec.trigger.selectors) for spec in specs):
        return
    listened = ", ".join(
        f"{dataset} ({', '.join(names)})" for dataset, names in sorted(listened_datasets().items())
    )
    raise UsageError(
        f"no pipeline listens to {TOPIC_DATA_LANDED} for dataset "
        f"{event.payload.get('dataset')!r}; the pipelines listen to: {listened}"
    )


def cmd_dead_letters(args: argparse.Namespace) -> int:
    from cascade.broker import dead_letter_summary

    print(json.dumps(dead_letter_summary(), indent=2))
    return 0


def cmd_step(args: argparse.Namespace) -> int:
    from cascade.lake import check_ds
    from cascade.pipeline_registry import get_pipeline
    from cascade.step_runner import knob_environment, run_step

    spec = get_pipeline(args.pipeline or _pipeline_of(args.name))
    if args.name not in spec.step_names:
        raise UsageError(
            f"unknown {spec.name} step {args.name!r}; choose one of {', '.join(spec.step_names)}"
        )
    try:
        check_ds(args.ds)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    params: dict[str, str] = {}
    for given in args.param or ():
        knob, sep, value = given.partition("=")
        if not sep or not knob:
            raise UsageError(f"--param takes KNOB=VALUE, got {given!r}")
        params[knob.strip()] = value
    try:
        knob_environment(spec.step(args.name), params)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    print(json.dumps(run_step(args.name, args.ds, spec.name, params), indent=2, default=str))
    return 0


def cmd_land(args: argparse.Namespace) -> int:
    from cascade.lake import check_ds, lake_from_settings
    from cascade.landing import get_dataset, land

    try:
        check_ds(args.ds)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    dataset = get_dataset(args.dataset)
    publish = None
    if not args.no_publish:
        from cascade.broker import publish as publish_event

        publish = publish_event
    record = land(
        lake_from_settings(),
        dataset,
        args.ds,
        path=Path(args.path) if args.path else None,
        fmt=args.format,
        source=args.source,
        replace=args.replace,
        publish=publish,
    )
    if args.json:
        print(json.dumps(record, indent=2, default=str))
    else:
        counts = ", ".join(f"{k} {v:,}" for k, v in record["counts"].items())
        print(f"landed {args.dataset} dt={args.ds} at {record['landed']} ({counts})")
    return 0


def _pipeline_of(step: str) -> str:
    """The one registered pipeline with a step of that name (``--pipeline`` names it when
    several have one)."""
    pipelines = registered_pipelines()
    owners = [name for name, spec in pipelines.items() if step in spec.step_names]
    if len(owners) == 1:
        return owners[0]
    if not owners:
        steps = "; ".join(f"{name}: {', '.join(p.step_names)}" for name, p in pipelines.items())
        raise UsageError(f"no pipeline has a step {step!r}; steps per pipeline: {steps}")
    raise UsageError(f"pipelines {', '.join(owners)} each have a step {step!r}; pass --pipeline")


def cmd_version(args: argparse.Namespace) -> int:
    versions = {"cascade": _version("cascade")}
    for package in (
        "apache-airflow", "pyspark", "torch", "deepspeed", "feast", "great-expectations",
        "mlflow", "kserve", "dvc", "confluent-kafka",
    ):  # fmt: skip
        versions[package] = _version(package)
    if args.json:
        print(json.dumps(versions, indent=2))
    else:
        print("  ".join(f"{name} {version}" for name, version in versions.items()))
    return 0


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def cmd_pipelines(args: argparse.Namespace) -> int:
    from cascade import pipeline_docs
    from cascade.dvc_stages import (
        dvc_lake,
        dvc_yaml,
        params_yaml,
        write_dvc_yaml,
        write_params_yaml,
    )

    specs = registered_pipelines()
    dvc_file, page = Path(args.dvc_file), Path(args.docs)
    params_file = dvc_file.with_name("params.yaml")
    if args.write or args.check:
        # The stages write where the steps do: the lake of CASCADE_HOME, inside the repository.
        try:
            lake = dvc_lake(load_settings().lake_root, dvc_file.resolve().parent)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    if args.markdown:
        print(pipeline_docs.render_markdown(specs.values()), end="")
        return 0
    if args.write:
        for path, changed in (
            (dvc_file, write_dvc_yaml(dvc_file, specs.values(), lake)),
            (params_file, write_params_yaml(params_file, specs.values())),
            (page, pipeline_docs.write_documented_table(page, specs.values())),
        ):
            print(f"{path}: {'written' if changed else 'already up to date'}", file=sys.stderr)
        return 0
    if args.check:
        stale = []
        if not dvc_file.is_file() or dvc_file.read_text() != dvc_yaml(specs.values(), lake):
            stale.append(str(dvc_file))
        current = params_file.read_text() if params_file.is_file() else ""
        if current != params_yaml(specs.values(), current):
            stale.append(str(params_file))
        reference = pipeline_docs.render_reference(specs.values())
        if pipeline_docs.documented_table(page.read_text()) != reference:
            stale.append(f"{page} (pipeline reference)")
        if stale:
            print(
                f"{', '.join(stale)} differ from the pipeline specs; run `cascade pipelines "
                "--write`",
                file=sys.stderr,
            )
            return 1
        return 0
    described = [spec.describe() for spec in specs.values()]
    if args.json:
        print(json.dumps(described, indent=2))
        return 0
    for item in described:
        trigger = item["assets"]["trigger"]
        start = " or ".join(
            part
            for part in (
                f"cron {item['schedule']['cron']} UTC" if item["schedule"]["cron"] else "",
                f"events {', '.join(trigger['selectors'])}" if trigger else "",
            )
            if part
        )
        model = item["registered_model"]
        print(f"{item['name']}: {item['description']}")
        print(f"  starts on: {start}")
        print(f"  steps: {' -> '.join(step['name'] for step in item['steps'])}")
        if model:
            rule = model["promotion"]
            better = "higher" if rule["higher_is_better"] else "lower"
            print(
                f"  registers: {model['name']}@{model['alias']} ({rule['metric']}, {better} wins, "
                f"tolerance {rule['tolerance']:g})"
            )
    return 0


def cmd_score(args: argparse.Namespace) -> int:
    spec = registered_models()[args.model]
    assert spec.model is not None and spec.model.score is not None
    request = {name: getattr(args, name) for name in SCORE_FIELDS}
    missing = [name for name in spec.model.score_needs if request.get(name) in (None, [], "")]
    if missing:
        flags = " and ".join(f"--{name}" for name in missing)
        raise UsageError(f"--model {args.model} needs {flags}")
    print(json.dumps(spec.model.score(request), indent=2, default=str))
    return 0


def cmd_release(args: argparse.Namespace) -> int:
    from cascade.config import load_settings
    from cascade.signing import new_signing_key, release_version, retire_key

    settings = load_settings()
    if args.new_key:
        keyid = new_signing_key(settings.home)
        print(f"new release key {keyid}; the previous public keys stay trusted until retired")
        return 0
    if args.retire_key:
        left = retire_key(settings.home, args.retire_key)
        print(f"retired release key {args.retire_key}; {left} trusted")
        return 0
    if not (args.model and args.version):
        raise UsageError("name the version to sign: --model M --version V (or --new-key)")
    release = release_version(settings, args.model, args.version, reason=args.reason)
    print(json.dumps({"model": release.model, "version": release.version,
                      "files": len(release.files), "compile_gate": release.compile_gate,
                      "decision": release.decision}, indent=2))  # fmt: skip
    return 0


def cmd_rollback(args: argparse.Namespace) -> int:
    from cascade.deployments import rollback

    result = rollback(reason=args.reason, model=args.model, expected=args.expect_version)
    print(json.dumps(result, indent=2))
    if not result["moved"]:
        print(result["skipped"], file=sys.stderr)
        return EXIT_FAILED
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from cascade.config import load_settings
    from cascade.lake import check_ds
    from cascade.run_report import write_report

    try:
        check_ds(args.ds)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    report = write_report(load_settings(), args.ds, Path(args.out), args.pipeline)
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        counts = report["counts"]
        print(
            f"ds={report['ds']}: {counts['ok']} steps ok, {counts['failed']} failed, "
            f"{counts['skipped']} skipped, {counts['not run']} not run; "
            f"{len(report['figures'])} figures, "
            f"{len(report['curves'])} training-curve sets -> {report['index']}"
        )
        if report["curves_note"]:
            print(f"note: {report['curves_note']}", file=sys.stderr)
    return 0


TOOLS: dict[str, tuple[str, dict[str, tuple[tuple[str, ...], str]]]] = {
    "ctr": (
        "click-log generation, pre-ranking training outside the DAG, the serving monitor",
        {
            "impressions": (
                ("jobs.impression_log",),
                "generate a deterministic impression log with its hidden model",
            ),
            "train": (
                (
                    "torch.distributed.run",
                    "--nproc_per_node",
                    "2",
                    "-m",
                    "models.preranking.cascade_train",
                ),
                "train the pre-ranking cascade on a training set (2 processes)",
            ),
            "monitor": (
                ("serving.monitor",),
                "feature drift and online AUC (--demo: generated logs with a known shift)",
            ),
        },
    ),
    "asr": (
        "the speech corpus, the ASR model's training, evaluation, compiling and serving",
        {
            "synthesize": (
                ("jobs.audio_corpus", "land"),
                "synthesize a deterministic batch of speech into a landing folder",
            ),
            "people": (
                ("jobs.speech_human",),
                "land recorded people's speech (every language) into a landing folder",
            ),
            "corpus": (
                ("jobs.audio_corpus", "build"),
                "build the speaker-disjoint corpus shards from a landing folder",
            ),
            "gate": (("jobs.audio_corpus_gate",), "the corpus's data-quality gate"),
            "train": (("models.asr.train",), "train the ASR model (DeepSpeed processes)"),
            "evaluate": (("models.asr.evaluate",), "character error rate, fp32 against int8"),
            "lm": (
                ("models.asr.language_model",),
                "fit a corpus's character n-grams and store them with a model",
            ),
            "compile": (("compilers.asr",), "compile a model folder for serving"),
            "serve": (("serving.asr",), "serve a model folder as the KServe model asr"),
        },
    ),
    "multimodal": (
        "the image-text corpus, the multimodal model's training and evaluation",
        {
            "sources": (
                ("jobs.multimodal_sources",),
                "land image-text pairs (stamps, emoji, generated) into a landing folder",
            ),
            "corpus": (("jobs.multimodal_corpus",), "decode and shard the image-text corpus"),
            "gate": (("jobs.multimodal_corpus_gate",), "the corpus's data-quality gate"),
            "train": (("models.multimodal.train",), "train the model (DeepSpeed processes)"),
            "evaluate": (("models.multimodal.evaluate",), "the MoE model against its dense twin"),
        },
    ),
    "ui-check": (
        "log in to the Airflow UI headless, read a DAG's runs, take a screenshot",
        {"": (("infra.ui_check",), "")},
    ),
}
"""Commands that run a module above the kernel as its own process: group -> (help, action ->
(``python -m`` arguments, help)); an action named ``""`` is the group itself. Their options are
the module's own (``cascade GROUP ACTION --help`` prints them) and so is their exit status."""


def cmd_tool(args: argparse.Namespace) -> int:
    import subprocess

    command = [sys.executable, "-m", *args.module, *args.forwarded]
    return subprocess.run(command, check=False).returncode


def _add_tools(sub: Any) -> None:
    for group, (group_help, actions) in TOOLS.items():
        if "" in actions:
            parser = sub.add_parser(group, help=group_help, add_help=False)
            parser.set_defaults(func=cmd_tool, module=actions[""][0], forwards=True)
            continue
        parsers = sub.add_parser(group, help=group_help).add_subparsers(
            dest=f"{group}_command", required=True, metavar="ACTION"
        )
        for action, (module, action_help) in actions.items():
            parser = parsers.add_parser(action, help=action_help, add_help=False)
            parser.set_defaults(func=cmd_tool, module=module, forwards=True)


def _add_core_commands(sub: Any) -> None:
    pipelines = registered_pipelines()
    models = registered_models()

    listing = sub.add_parser(
        "pipelines", help="the registered pipelines: steps, assets, schedule, registered model"
    )
    listing.add_argument("--json", action="store_true", help="print JSON")
    what = listing.add_mutually_exclusive_group()
    what.add_argument(
        "--markdown", action="store_true", help="print the pipelines reference page's table"
    )
    what.add_argument(
        "--write",
        action="store_true",
        help="regenerate dvc.yaml, params.yaml and docs/reference/pipelines.md from the specs",
    )
    what.add_argument(
        "--check", action="store_true", help="exit 1 when either differs from the specs"
    )
    listing.add_argument("--dvc-file", default=str(REPO_ROOT / "dvc.yaml"), help=argparse.SUPPRESS)
    reference = REPO_ROOT / "docs" / "reference" / "pipelines.md"
    listing.add_argument("--docs", default=str(reference), help=argparse.SUPPRESS)
    listing.set_defaults(func=cmd_pipelines)

    from cascade.config_report import cmd_config

    config = sub.add_parser("config", help="every CASCADE_* setting: its value and its source")
    shown = config.add_mutually_exclusive_group()
    shown.add_argument("--json", action="store_true", help="print JSON")
    shown.add_argument(
        "--markdown", action="store_true", help="print the settings reference page's table"
    )
    shown.add_argument(
        "--write-docs", action="store_true", help="rewrite docs/reference/settings.md's table"
    )
    shown.add_argument(
        "--check-docs", action="store_true", help="exit 1 when the settings page's table differs"
    )
    config.set_defaults(func=cmd_config)

    steps = "; ".join(f"{name}: {', '.join(spec.step_names)}" for name, spec in pipelines.items())
    step = sub.add_parser(
        "step",
        help="run one pipeline step (the DAG task / DVC stage of that name)",
        epilog=f"steps per pipeline: {steps}",
    )
    step.add_argument("name", help="step name (see below)")
    step.add_argument("--ds", required=True, help="partition date YYYY-MM-DD")
    step.add_argument(
        "--pipeline",
        choices=tuple(pipelines),
        help="the DAG whose step it is (needed when several pipelines have a step of that name)",
    )
    step.add_argument(
        "--param",
        action="append",
        metavar="KNOB=VALUE",
        help="set one of the step's knobs for this run (its CASCADE_* setting; the DVC stage "
        "passes params.yaml's <pipeline>.<knob>); repeatable",
    )
    step.set_defaults(func=cmd_step)

    from cascade.landing import describe_datasets

    landing = sub.add_parser(
        "land",
        help="land a partition of a dataset from where its data is (or from a named source)",
        description=textwrap.fill(
            "Read the data at PATH, check its format, write the partition's landing folder "
            "atomically with its markers and counts, and publish cascade.data.landed. Exit 2 for "
            "a bad option, an unknown format or a partition that already landed (without "
            "--replace); 1 when the importer refuses the data; 3 when PATH is missing or the "
            "broker is down (the batch has landed then: publish the event again).",
            92,
        ),
        epilog=f"datasets and their formats:\n{describe_datasets()}",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    landing.add_argument("dataset", help="the dataset (see below)")
    landing.add_argument("path", nargs="?", help="the file or folder to land (read in place)")
    landing.add_argument("--ds", required=True, help="partition date YYYY-MM-DD")
    landing.add_argument("--format", help="the data's format (default: guessed from its files)")
    landing.add_argument(
        "--source",
        help="a named source: without PATH one that makes its own batch (generated, "
        "synthetic); with PATH one that names the data's shape (a registered log source)",
    )
    landing.add_argument(
        "--replace", action="store_true", help="land a partition that has landed before"
    )
    landing.add_argument(
        "--no-publish", action="store_true", help="land without publishing cascade.data.landed"
    )
    landing.add_argument("--json", action="store_true", help="print the landing record as JSON")
    landing.set_defaults(func=cmd_land)

    scorable = {
        name: spec.model for name, spec in models.items() if spec.model and spec.model.score
    }

    def needed_by(field: str) -> str:
        names = [name for name, model in scorable.items() if field in model.score_needs]
        return f" (needed by {', '.join(names)})" if names else ""

    score = sub.add_parser("score", help="ask the served champion of a model")
    score.add_argument("--model", required=True, choices=tuple(scorable))
    score.add_argument("--user", type=int, help="user id" + needed_by("user"))
    score.add_argument(
        "--items", type=int, nargs="+", help="candidate item ids" + needed_by("items")
    )
    score.add_argument("--audio", help="a WAV file to transcribe" + needed_by("audio"))
    score.set_defaults(func=cmd_score)

    release = sub.add_parser(
        "release",
        help="sign a registered version with the platform's release key (the servers load only "
        "signed versions); rotate the key",
    )
    release.add_argument("--model", choices=tuple(models))
    release.add_argument("--version", help="the registered version to sign")
    release.add_argument("--reason", default="manual", help="recorded in the signed decision")
    release.add_argument(
        "--new-key", action="store_true", help="make a new key pair (the old public key stays)"
    )
    release.add_argument("--retire-key", metavar="KEYID", help="stop trusting a public key")
    release.set_defaults(func=cmd_release)

    back = sub.add_parser(
        "rollback", help="point a model's champion alias back at the version it replaced"
    )
    back.add_argument("--model", required=True, choices=tuple(models))
    back.add_argument("--reason", default="manual", help="recorded on the rolled-back version")
    back.add_argument(
        "--expect-version",
        help="roll back only if this version is still the champion (default: the champion "
        "read when the command starts); exit 1 without a move when it is not",
    )
    back.set_defaults(func=cmd_rollback)

    events = sub.add_parser("events", help="Kafka events").add_subparsers(
        dest="events_command", required=True
    )
    pub = events.add_parser("publish", help="publish one event (acks=all)")
    pub.add_argument("type", help="event type = topic, e.g. cascade.data.landed")
    pub.add_argument("--dataset")
    pub.add_argument("--partition", help="YYYY-MM-DD")
    pub.add_argument("--payload", help="JSON object merged into the payload")
    pub.set_defaults(func=cmd_publish)
    events.add_parser("dead-letters", help="count the dead-letter topic by reason").set_defaults(
        func=cmd_dead_letters
    )
    report = sub.add_parser(
        "report",
        help="one HTML page for a partition: every step's status, time, gate verdict, "
        "figures and training curves",
    )
    report.add_argument("--ds", required=True, help="partition date YYYY-MM-DD")
    report.add_argument("--out", required=True, help="folder for index.html, report.json, PNGs")
    report.add_argument(
        "--pipeline",
        action="append",
        choices=tuple(pipelines),
        help="only this pipeline (repeatable; default: all)",
    )
    report.add_argument("--json", action="store_true", help="print report.json's content")
    report.set_defaults(func=cmd_report)
    version = sub.add_parser("version", help="the versions of cascade and of the stack's parts")
    version.add_argument("--json", action="store_true", help="print JSON")
    version.set_defaults(func=cmd_version)


HELP_ORDER = (
    "up", "down", "status", "demo", "manifests", "config",  # the stack and its settings
    "pipelines", "land", "events", "step", "report",  # data in, pipelines run
    "score", "rollback", "release",  # the served models
    "ctr", "asr", "multimodal",  # each domain's tools, run outside the DAGs
    "bench", "ui-check", "version",
)  # fmt: skip
"""The order ``cascade --help`` lists commands in (a command not named here comes last)."""


def build_parser() -> tuple[argparse.ArgumentParser, tuple[type[BaseException], ...]]:
    """The parser, and the error types that the registered commands report as one line."""
    parser = argparse.ArgumentParser(
        prog="cascade", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--debug", action="store_true", help="show the traceback of an error, not one line"
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _add_core_commands(sub)
    _add_tools(sub)
    errors: list[type[BaseException]] = []
    seen: set[str] = set()
    for entry in sorted(importlib.metadata.entry_points(group=COMMANDS_GROUP), key=str):
        if entry.value in seen:
            continue
        seen.add(entry.value)
        errors.extend(entry.load()(sub) or ())
    listed = {name: index for index, name in enumerate(HELP_ORDER)}
    sub._choices_actions.sort(key=lambda action: listed.get(action.dest, len(listed)))
    return parser, tuple(errors)


def _use_stack_credentials() -> None:
    """Give this process the local stack's MLflow credentials (when the settings point at its
    tracking server) and its model servers' token (when it stands in), so every command's
    clients authenticate. A bad setting is left to
    the command, which reports it (``cascade config`` lists them all)."""
    from cascade.config import SettingsError, load_settings
    from cascade.serving_token import use_serving_token
    from cascade.tracking_auth import use_tracking_credentials

    try:
        settings = load_settings()
    except SettingsError:
        return
    use_tracking_credentials(settings)
    use_serving_token(settings)


def main(argv: list[str] | None = None) -> int:
    parser, _ = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra and not getattr(args, "forwards", False):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.forwarded = extra
    try:
        _use_stack_credentials()
        return int(args.func(args))
    except KeyboardInterrupt:
        return 130
    except Exception as exc:  # a CLI error is one clear line, not a traceback
        if args.debug:
            raise
        code = exit_code(exc)
        message = one_line(exc)
        if code == EXIT_NOT_READY and not isinstance(exc, NotReady | FileNotFoundError):
            message = (
                f"{type(exc).__name__}: {message[:300]}. Is the stack up? `cascade status` "
                "shows each service; `cascade up` starts them"
            )
        hint = "" if code == EXIT_USAGE else " (cascade --debug ... shows the traceback)"
        print(f"cascade {args.command}: {message}{hint}", file=sys.stderr)
        return code


if __name__ == "__main__":
    sys.exit(main())
