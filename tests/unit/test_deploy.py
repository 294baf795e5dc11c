"""Every deploy/ manifest parses and runs only real ``unstuck`` commands with valid options.

The YAML manifests are read with PyYAML (``SafeLoader``) and kept to a small strict subset,
checked by ``_yaml_documents`` below: block mappings and sequences, ``|`` literal blocks, quoted
or plain scalars, and flow collections in JSON form. Anchors, aliases, tags, folded blocks,
multi-line plain scalars, duplicate keys and the YAML 1.1 booleans (``yes``/``on``, which YAML
1.1 and 1.2 readers disagree on) are refused with the line number.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
import shlex
from collections.abc import Hashable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from workers.cli.main import build_parser
from workers.config_file import read_config_file, translate_reference_config
from workers.settings import Settings, load_settings

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
# Programs other than unstuck a manifest may run, with what their argv must contain.
OTHER_PROGRAMS = {
    "redis-server": [],
    "redis-cli": [],
    "celery": ["-A", "workers.celery_edge.app"],
    "sh": ["exec redis-server /tmp/sentinel.conf --sentinel"],  # a Sentinel writing its config first
}


class ManifestError(ValueError):
    """Raised when a manifest leaves the YAML subset or the systemd unit syntax."""


# --- YAML: PyYAML, with the manifests' subset enforced on top ------------------------------

# Booleans to YAML 1.1 readers (PyYAML too), strings to YAML 1.2 ones; y/n only by the 1.1 spec.
_YAML11_BOOLS = {"yes", "no", "on", "off"}
_YAML11_YN = {"y", "n"}
_JSON_PLAIN = re.compile(r"-?(0|[1-9]\d*)(\.\d+)?([eE][-+]?\d+)?|true|false|null")
_FLOW_START = (yaml.FlowSequenceStartToken, yaml.FlowMappingStartToken)
_FLOW_END = (yaml.FlowSequenceEndToken, yaml.FlowMappingEndToken)


class _StrictLoader(yaml.SafeLoader):
    """``SafeLoader`` that refuses a duplicate key (PyYAML would keep the last one silently)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        seen: set[str] = set()
        for key, _value in node.value:
            if isinstance(key, yaml.ScalarNode):
                if key.value in seen:
                    raise ManifestError(f"line {key.start_mark.line + 1}: duplicate key {key.value!r}")
                seen.add(key.value)
        return super().construct_mapping(node, deep=deep)


def _check_subset(text: str) -> None:
    """Refuse, by token, what the manifests keep out of their YAML."""
    flow, previous = 0, None
    for token in yaml.scan(text, Loader=yaml.SafeLoader):
        number, is_key, previous = token.start_mark.line + 1, isinstance(previous, yaml.KeyToken), token
        if isinstance(token, _FLOW_START):
            flow += 1
        elif isinstance(token, _FLOW_END):
            flow -= 1
        elif isinstance(token, yaml.AnchorToken | yaml.AliasToken | yaml.TagToken):
            kind = type(token).__name__.removesuffix("Token").lower()
            raise ManifestError(f"line {number}: outside the YAML subset: {kind} {token.value!r}")
        elif not isinstance(token, yaml.ScalarToken):
            continue
        elif token.style == ">" or (
            token.plain and token.value.lower() in (_YAML11_BOOLS if is_key else _YAML11_BOOLS | _YAML11_YN)
        ):
            raise ManifestError(f"line {number}: outside the YAML subset: {token.value!r}")
        elif token.plain and token.end_mark.line != token.start_mark.line:
            raise ManifestError(f"line {number + 1}: unexpected indentation: {token.value!r}")
        elif flow and token.style != '"' and not (token.plain and _JSON_PLAIN.fullmatch(token.value)):
            raise ManifestError(f"line {number}: not JSON-form: {token.value!r}")


def _yaml_documents(text: str) -> list[Any]:
    """One value per ``---``-separated document; empty documents are skipped."""
    try:
        _check_subset(text)
        return [doc for doc in yaml.load_all(text, Loader=_StrictLoader) if doc is not None]
    except yaml.YAMLError as exc:
        raise ManifestError(str(exc)) from None


# --- systemd units -----------------------------------------------------------------------

_SPECIFIERS = {"%%": "%", "%i": "1", "%I": "1", "%H": "host", "%n": "unit.service"}


def _unit(text: str) -> dict[str, dict[str, list[str]]]:
    """A systemd unit as section -> key -> every value (keys may repeat)."""
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for number, line in enumerate(text.replace("\\\n", " ").splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped[0] in "#;":
            continue
        if stripped.startswith("[") and stripped.endswith("]"):
            current = sections.setdefault(stripped[1:-1], {})
        elif "=" in stripped and current is not None:
            key, _, value = stripped.partition("=")
            current.setdefault(key.strip(), []).append(value.strip())
        else:
            raise ManifestError(f"line {number}: not `Key=value` inside a section: {stripped!r}")
    return sections


def _expand_specifiers(value: str) -> str:
    """What systemd passes to the program; an unknown ``%x`` is refused (``%h`` is $HOME)."""

    def expand(match: re.Match[str]) -> str:
        if match.group(0) not in _SPECIFIERS:
            raise ManifestError(f"systemd specifier {match.group(0)} in {value!r} (escape as %%)")
        return _SPECIFIERS[match.group(0)]

    return re.sub(r"%.", expand, value)


# --- commands of each manifest -----------------------------------------------------------


@dataclass(frozen=True)
class Command:
    """One command line a manifest runs, with where it comes from."""

    manifest: str
    where: str
    argv: tuple[str, ...]


def _rel(path: Path) -> str:
    return str(path.relative_to(DEPLOY.parent))


def _strip_wrappers(argv: list[str]) -> list[str]:
    if argv and Path(argv[0]).name == "tini":
        argv = argv[2:] if argv[1:2] == ["--"] else argv[1:]
    if argv[:2] in (["sh", "-c"], ["/bin/sh", "-c"]):
        argv = shlex.split(argv[2])
    if argv[:1] == ["exec"]:
        argv = argv[1:]
    if argv[:1] == ["CMD"]:
        argv = argv[1:]
    if argv[:1] == ["CMD-SHELL"]:
        argv = shlex.split(argv[1])
    return [part for part in argv if part not in (">", "/dev/null")]


def _compose_commands(path: Path) -> Iterator[Command]:
    (document,) = _yaml_documents(path.read_text())
    for name, service in document["services"].items():
        if "command" in service:
            yield Command(_rel(path), f"services.{name}.command", tuple(service["command"]))
        if "healthcheck" in service:
            test = _strip_wrappers(list(service["healthcheck"]["test"]))
            yield Command(_rel(path), f"services.{name}.healthcheck.test", tuple(test))


def _containers(document: dict[str, Any]) -> list[dict[str, Any]]:
    spec = document.get("spec", {}).get("template", {}).get("spec", {})
    containers: list[dict[str, Any]] = spec.get("containers", [])
    return containers


def _k8s_commands(path: Path) -> Iterator[Command]:
    for number, document in enumerate(_yaml_documents(path.read_text())):
        for container in _containers(document):
            where = f"doc {number} container {container['name']}"
            argv = [*container.get("command", []), *container.get("args", [])]
            yield Command(_rel(path), f"{where} command+args", tuple(_strip_wrappers(argv)))
            for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
                exec_ = container.get(probe, {}).get("exec")
                if exec_:
                    argv = _strip_wrappers(list(exec_["command"]))
                    yield Command(_rel(path), f"{where} {probe}", tuple(argv))


def _systemd_commands(path: Path) -> Iterator[Command]:
    for line in _unit(path.read_text()).get("Service", {}).get("ExecStart", []):
        argv = shlex.split(_expand_specifiers(line.lstrip("-@:+!")))
        yield Command(_rel(path), "ExecStart", tuple(argv))


def _dockerfile_commands(path: Path) -> Iterator[Command]:
    forms: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        word, _, rest = line.partition(" ")
        if word in ("CMD", "ENTRYPOINT"):
            try:
                forms[word] = json.loads(rest)
            except json.JSONDecodeError:
                raise ManifestError(f"{_rel(path)}: {word} must use the JSON (exec) form") from None
    argv = _strip_wrappers([*forms.get("ENTRYPOINT", []), *forms.get("CMD", [])])
    yield Command(_rel(path), "ENTRYPOINT+CMD", tuple(argv))


def _all_commands() -> list[Command]:
    commands: list[Command] = []
    commands += _compose_commands(DEPLOY / "compose.yaml")
    commands += _compose_commands(DEPLOY / "compose.sentinel.yaml")
    commands += _dockerfile_commands(DEPLOY / "Dockerfile")
    for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
        commands += _k8s_commands(path)
    for path in sorted((DEPLOY / "systemd").glob("*.service")):
        commands += _systemd_commands(path)
    return commands


COMMANDS = _all_commands()


def _subcommands(parser: argparse.ArgumentParser) -> set[str]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return set(action.choices)
    return set()


def _parse_unstuck(command: Command) -> argparse.Namespace:
    """``parse_args`` of the real CLI; a usage error fails with the manifest and the command."""
    parser = build_parser()
    argv = list(command.argv[1:])
    pending = {"flower"} - _subcommands(parser)
    if argv[:1] and argv[0] in pending:
        pytest.skip(f"`unstuck {argv[0]}` is not registered yet (being written); {command.manifest}")
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            return parser.parse_args(argv)
    except SystemExit:
        pytest.fail(
            f"{command.manifest} ({command.where}) runs an invalid command: "
            f"{shlex.join(command.argv)}\n{stderr.getvalue().strip()}"
        )


# --- tests ---------------------------------------------------------------------------------


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: f"{c.manifest}:{c.where}")
def test_each_manifest_command_is_a_real_command(command: Command) -> None:
    program = Path(command.argv[0]).name if command.argv else ""
    if program == "unstuck":
        _parse_unstuck(command)
        return
    assert program in OTHER_PROGRAMS, f"{command.manifest} ({command.where}) runs {command.argv}"
    needed = OTHER_PROGRAMS[program]
    joined = " ".join(command.argv)
    assert " ".join(needed) in joined, f"{command.manifest} ({command.where}): {joined} lacks {needed}"


def test_the_manifests_run_worker_watchdog_beat_and_flower() -> None:
    by_manifest: dict[str, set[str]] = {}
    for command in COMMANDS:
        if Path(command.argv[0]).name == "unstuck":
            by_manifest.setdefault(command.manifest, set()).add(command.argv[1])
    assert by_manifest["deploy/compose.yaml"] >= {"worker", "watchdog", "beat", "flower"}
    k8s = set().union(*(v for k, v in by_manifest.items() if k.startswith("deploy/k8s/")))
    systemd = set().union(*(v for k, v in by_manifest.items() if k.startswith("deploy/systemd/")))
    assert k8s >= {"worker", "watchdog", "beat", "flower"}
    assert systemd >= {"worker", "watchdog", "beat", "flower"}


def test_no_manifest_puts_the_flower_password_on_a_command_line() -> None:
    flowers = [c for c in COMMANDS if Path(c.argv[0]).name == "unstuck" and c.argv[1] == "flower"]
    assert len(flowers) == 3
    for command in flowers:
        assert "--basic-auth" not in command.argv, f"{command.manifest}: use FLOWER_BASIC_AUTH"


def _bad(command: tuple[str, ...]) -> Command:
    return Command("deploy/fake.yaml", "services.x.command", command)


@pytest.mark.parametrize(
    "argv",
    [
        ("unstuck", "wroker"),
        ("unstuck", "worker", "--concurency", "2"),
        ("unstuck", "worker", "--concurrency", "two"),
        ("unstuck", "beat", "--concurrency", "2"),
        ("unstuck",),
    ],
)
def test_a_bad_command_fails_naming_the_manifest(argv: tuple[str, ...]) -> None:
    with pytest.raises(pytest.fail.Exception, match=r"deploy/fake\.yaml .*runs an invalid command"):
        _parse_unstuck(_bad(argv))


def test_compose_services() -> None:
    (compose,) = _yaml_documents((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    redis = services["redis"]["command"]
    assert redis[redis.index("--appendonly") + 1] == "yes", "Redis must persist with AOF"
    assert services["beat"]["deploy"]["replicas"] == 1
    assert "--basic-auth" not in services["flower"]["command"], "a flag shows the password in ps"
    assert "FLOWER_BASIC_AUTH:?" in services["flower"]["environment"]["FLOWER_BASIC_AUTH"]
    assert all(p.startswith("127.0.0.1:") for p in services["flower"]["ports"])


def test_compose_with_sentinel_keeps_writes_on_a_replica() -> None:
    (compose,) = _yaml_documents((DEPLOY / "compose.sentinel.yaml").read_text())
    services = compose["services"]
    for name in ("redis-primary", "redis-replica", "redis-replica-2"):
        redis = services[name]["command"]
        settings = {flag: redis[redis.index(flag) + 1] for flag in redis if flag.startswith("--")}
        assert settings["--min-replicas-to-write"] == "1", name
        assert settings["--min-replicas-max-lag"] == "10", name
        assert settings["--appendonly"] == "yes", name
        assert settings["--maxmemory-policy"] == "noeviction", name
    sentinels = [name for name in services if name.startswith("sentinel-")]
    assert len(sentinels) == 3
    for name in ("worker", "watchdog", "beat"):
        environment = services[name]["environment"]
        assert environment["UNSTUCK_REDIS__URL"].count("sentinel://") == 3, name
        assert environment["UNSTUCK_REDIS__SENTINEL_MASTER"] == "unstuck-primary", name
        assert environment["UNSTUCK_REDIS__MIN_REPLICA_ACKS"] == "1", name


def test_compose_with_sentinel_runs_two_replicas() -> None:
    (compose,) = _yaml_documents((DEPLOY / "compose.sentinel.yaml").read_text())
    replicas = [
        name for name, service in compose["services"].items() if "--replicaof" in service.get("command", [])
    ]
    assert replicas == ["redis-replica", "redis-replica-2"]


def test_kubernetes_runs_a_primary_two_replicas_and_three_sentinels() -> None:
    objects = _k8s_objects()
    redis = objects[("StatefulSet", "unstuck-redis")]["spec"]
    sentinels = objects[("StatefulSet", "unstuck-sentinel")]["spec"]
    assert (redis["replicas"], sentinels["replicas"]) == (3, 3)
    (config,) = redis["template"]["spec"]["initContainers"]
    script = config["command"][-1]
    for line in ("min-replicas-to-write 1", "appendonly yes", "maxmemory-policy noeviction"):
        assert line in script
    assert (
        "sentinel monitor unstuck-primary $primary 6379 2"
        in sentinels["template"]["spec"]["initContainers"][0]["command"][-1]
    )
    data = objects[("ConfigMap", "unstuck-config")]["data"]
    assert data["UNSTUCK_REDIS__SENTINEL_MASTER"] == "unstuck-primary"
    secret = objects[("Secret", "unstuck-secrets")]["stringData"]
    assert secret["UNSTUCK_REDIS__URL"].count("sentinel://") == 3


def _k8s_objects() -> dict[tuple[str, str], dict[str, Any]]:
    objects = {}
    for path in sorted((DEPLOY / "k8s").glob("*.yaml")):
        for document in _yaml_documents(path.read_text()):
            if "metadata" in document:
                objects[(document["kind"], document["metadata"]["name"])] = document
    return objects


def test_kubernetes_shapes() -> None:
    objects = _k8s_objects()
    beat = objects[("Deployment", "unstuck-beat")]["spec"]
    assert beat["replicas"] == 1
    assert beat["strategy"]["type"] == "Recreate"
    (worker,) = _containers(objects[("Deployment", "unstuck-worker")])
    assert "exec" in worker["livenessProbe"]
    assert ("Service", "unstuck-flower") in objects
    secret = objects[("Secret", "unstuck-secrets")]["stringData"]
    assert {"UNSTUCK_REDIS__URL", "FLOWER_BASIC_AUTH"} <= set(secret)
    (flower,) = _containers(objects[("Deployment", "unstuck-flower")])
    assert {"secretRef": {"name": "unstuck-secrets"}} in flower["envFrom"]
    for kind, name in objects:
        if kind == "Deployment":
            (container,) = _containers(objects[(kind, name)])
            assert "command" not in container, f"{name}: use args, keep tini as PID 1"


def test_kubernetes_configmap_holds_a_valid_config_file(tmp_path: Path) -> None:
    data = _k8s_objects()[("ConfigMap", "unstuck-config")]["data"]
    assert data["UNSTUCK_CONFIG"].endswith("/unstuck.json")
    (tmp_path / "unstuck.json").write_text(data["unstuck.json"])
    translated = translate_reference_config(read_config_file(str(tmp_path / "unstuck.json")))
    assert load_settings(**translated).tools.timeouts_s["exec"] == 120


def test_the_example_config_file_loads() -> None:
    translated = translate_reference_config(read_config_file(str(DEPLOY / "unstuck.toml")))
    assert load_settings(**translated).worker.prefetch_multiplier == 1
    assert load_settings(**translated).worker.give_back_after_ms == 250


def _setting_exists(name: str) -> bool:
    model: type[BaseModel] = Settings
    parts = name.removeprefix("UNSTUCK_").lower().split("__")
    for index, part in enumerate(parts):
        field = model.model_fields.get(part)
        if field is None:
            return False
        annotation = field.annotation
        if index < len(parts) - 1:
            if not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
                return False
            model = annotation
    return True


@pytest.mark.parametrize(
    "path",
    [
        DEPLOY / "unstuck.env.example",
        *(DEPLOY / "k8s").glob("configmap.yaml"),
        *(DEPLOY / "k8s").glob("secret.example.yaml"),
    ],
    ids=_rel,
)
def test_every_unstuck_variable_names_a_setting(path: Path) -> None:
    if path.suffix == ".yaml":
        (document,) = _yaml_documents(path.read_text())
        names = list(document.get("data", {}) or document.get("stringData", {}))
    else:
        lines = [line for line in path.read_text().splitlines() if line and not line.startswith("#")]
        names = [line.partition("=")[0] for line in lines]
    unknown = [n for n in names if n.startswith("UNSTUCK_") and not _setting_exists(n)]
    assert not unknown, f"{_rel(path)}: no such setting: {unknown}"


@pytest.mark.parametrize("name", ["UNSTUCK_REDIS_URL", "UNSTUCK_REDIS__UR", "UNSTUCK_WORKER__POOL__X"])
def test_a_misspelt_variable_is_caught(name: str) -> None:
    assert not _setting_exists(name)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a: &x 1\n", "outside the YAML subset"),
        ("a: yes\n", "outside the YAML subset"),
        ("a: 1\na: 2\n", "duplicate key"),
        ("a: b\n  c\n", "unexpected indentation"),
        ("a: ['x', 1]\n", "not JSON-form"),
        ("a: >\n  folded\n", "outside the YAML subset"),
    ],
)
def test_the_yaml_subset_is_strict(text: str, message: str) -> None:
    with pytest.raises(ManifestError, match=message):
        _yaml_documents(text)


def test_the_yaml_subset_reads_what_the_manifests_use() -> None:
    text = (
        "k:\n- a: 1\n  b: [\"x\", 2]\n- 'it''s'\nm:\n  n: |\n    line 1\n\n    line 3\n"
        '  o: "q"  # comment\n---\nz: true\n'
    )
    assert _yaml_documents(text) == [
        {"k": [{"a": 1, "b": ["x", 2]}, "it's"], "m": {"n": "line 1\n\nline 3\n", "o": "q"}},
        {"z": True},
    ]


@pytest.mark.parametrize(
    ("value", "expected"),
    [("unstuck-%i@%H", "unstuck-1@host"), ("unstuck@%%h", "unstuck@%h")],
)
def test_systemd_specifiers(value: str, expected: str) -> None:
    assert _expand_specifiers(value) == expected


def test_celery_percent_h_unescaped_in_a_unit_is_refused() -> None:
    with pytest.raises(ManifestError, match="%h"):
        _expand_specifiers("--hostname unstuck@%h")
