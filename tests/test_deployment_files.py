"""Static checks of docker-compose.yml and the Dockerfile.

Docker is not needed (or available) in CI, so these tests parse the files and
check the properties a deployment silently depends on: a KRaft-mode Kafka
without ZooKeeper, no topic auto-creation, and every settlement service
pointing at the broker's advertised listener with one shared connection string.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from settlement.testing.apache_kafka import BROKER_SETTINGS, KAFKA_VERSION, replication_settings

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    data = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(data, dict) and isinstance(data.get("services"), dict)
    return data


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return compose["services"]


def _env(service: dict[str, Any]) -> dict[str, str]:
    """A service's environment as a dict, whichever of the two compose forms it uses."""
    env = service.get("environment") or {}
    if isinstance(env, list):
        pairs = (item.split("=", 1) for item in env)
        return {k: v for k, v in pairs}
    return {str(k): "" if v is None else str(v) for k, v in env.items()}


def _as_argv(value: str | list[Any] | None) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return shlex.split(value)
    return [str(v) for v in value]


def _dockerfile_entrypoint() -> list[str]:
    match = re.search(r"^ENTRYPOINT\s+(\[.*\])\s*$", DOCKERFILE.read_text(), re.MULTILINE)
    assert match, "Dockerfile has no exec-form ENTRYPOINT"
    return yaml.safe_load(match.group(1))


def _argv(service: dict[str, Any]) -> list[str]:
    """The full command line a service runs: entrypoint (compose or Dockerfile) + command."""
    if "entrypoint" in service:
        entrypoint = _as_argv(service["entrypoint"])
    elif "build" in service:
        entrypoint = _dockerfile_entrypoint()
    else:
        entrypoint = []
    return entrypoint + _as_argv(service.get("command"))


def _option(argv: list[str], name: str) -> str | None:
    for i, arg in enumerate(argv):
        if arg == name and i + 1 < len(argv):
            return argv[i + 1]
        if arg.startswith(name + "="):
            return arg.split("=", 1)[1]
    return None


def _depends_on(service: dict[str, Any]) -> set[str]:
    deps = service.get("depends_on") or []
    return set(deps) if isinstance(deps, list) else set(deps.keys())


def _connection_string_fields(conn: str) -> dict[str, str]:
    fields = dict(part.split("=", 1) for part in conn.split(";") if part)
    assert "Endpoint" in fields, f"no Endpoint in {conn!r}"
    return fields


def _listeners(value: str) -> dict[str, str]:
    """``"PLAINTEXT://kafka:9092,CONTROLLER://:9093"`` -> ``{"PLAINTEXT": "kafka:9092", ...}``."""
    result = {}
    for item in value.split(","):
        name, _, address = item.strip().partition("://")
        result[name] = address
    return result


def _kafka(services: dict[str, dict[str, Any]]) -> tuple[str, dict[str, Any]]:
    matches = [
        (name, svc)
        for name, svc in services.items()
        if str(svc.get("image", "")).startswith("apache/kafka:")
    ]
    assert len(matches) == 1, f"expected one apache/kafka service, found {[n for n, _ in matches]}"
    return matches[0]


def _workers(services: dict[str, dict[str, Any]]) -> dict[str, list[str]]:
    return {
        name: argv
        for name, svc in services.items()
        if (argv := _argv(svc))[:2] == ["settlement", "worker"]
    }


def test_kafka_runs_in_kraft_mode(services: dict[str, dict[str, Any]]) -> None:
    name, kafka = _kafka(services)
    assert name == "kafka"
    env = _env(kafka)
    roles = {r.strip() for r in env["KAFKA_PROCESS_ROLES"].split(",")}
    assert roles == {"broker", "controller"}
    node_id = env["KAFKA_NODE_ID"]
    voters = env["KAFKA_CONTROLLER_QUORUM_VOTERS"].split(",")
    assert voters == [f"{node_id}@kafka:9093"], voters
    controller_names = env["KAFKA_CONTROLLER_LISTENER_NAMES"]
    assert controller_names in _listeners(env["KAFKA_LISTENERS"])
    assert _listeners(env["KAFKA_LISTENERS"])[controller_names].endswith(":9093")
    for key in (
        "KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR",
        "KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR",
        "KAFKA_TRANSACTION_STATE_LOG_MIN_ISR",
    ):
        assert env[key] == "1", f"{key}={env[key]!r}: a single node cannot hold more replicas"


def test_kafka_has_the_version_and_settings_of_the_tests(
        services: dict[str, dict[str, Any]]) -> None:
    _, kafka = _kafka(services)
    assert kafka["image"] == f"apache/kafka:{KAFKA_VERSION}"
    env = _env(kafka)
    expected = {**BROKER_SETTINGS, **replication_settings(1)}  # the tests' one-node cluster
    found = {key: env.get("KAFKA_" + key.upper().replace(".", "_")) for key in expected}
    assert found == expected


def test_no_zookeeper_anywhere(compose: dict[str, Any]) -> None:
    # The parsed document, so a comment saying "no ZooKeeper" does not count.
    config = yaml.safe_dump(compose).lower()
    assert "zookeeper" not in config
    assert "zk" not in re.findall(r"[a-z]+", config)


def test_topic_auto_creation_disabled(services: dict[str, dict[str, Any]]) -> None:
    _, kafka = _kafka(services)
    assert _env(kafka)["KAFKA_AUTO_CREATE_TOPICS_ENABLE"].lower() == "false"


def test_kafka_has_healthcheck(services: dict[str, dict[str, Any]]) -> None:
    _, kafka = _kafka(services)
    test = kafka["healthcheck"]["test"]
    command = " ".join(test) if isinstance(test, list) else test
    assert "kafka-broker-api-versions.sh" in command or "kafka-topics.sh" in command


def test_worker_points_at_advertised_listener(services: dict[str, dict[str, Any]]) -> None:
    kafka_name, kafka = _kafka(services)
    workers = _workers(services)
    assert workers, "no service runs `settlement worker`"
    advertised = set(_listeners(_env(kafka)["KAFKA_ADVERTISED_LISTENERS"]).values())
    for name, argv in workers.items():
        conn = _option(argv, "--connection-string")
        assert conn, f"{name} has no --connection-string"
        endpoint = _connection_string_fields(conn)["Endpoint"]
        assert endpoint.startswith("kafka://"), endpoint
        host_port = endpoint.removeprefix("kafka://")
        assert host_port in advertised, f"{name}: {host_port} not in {advertised}"
        assert host_port.split(":")[0] == kafka_name
        assert _option(argv, "--data-dir"), f"{name} has no --data-dir"
        assert kafka_name in _depends_on(services[name])


def test_workers_have_their_own_data_volumes(services: dict[str, dict[str, Any]]) -> None:
    workers = _workers(services)
    assert len(workers) >= 2, f"expected two engines, found {sorted(workers)}"
    mounts = {}
    for name, argv in workers.items():
        data_dir = _option(argv, "--data-dir")
        sources = [
            str(v).split(":")[0]
            for v in services[name].get("volumes", [])
            if str(v).split(":")[1] == data_dir
        ]
        assert len(sources) == 1, f"{name}: no volume mounted at {data_dir}"
        mounts[name] = sources[0]
    assert len(set(mounts.values())) == len(mounts), f"engines share a data volume: {mounts}"


def test_kafka_clients_share_one_connection_string(services: dict[str, dict[str, Any]]) -> None:
    kafka_name, _ = _kafka(services)
    clients = {n: s for n, s in services.items() if kafka_name in _depends_on(s)}
    assert len(clients) >= 3, f"expected engines and monitor to depend on kafka: {sorted(clients)}"
    seen: dict[str, str] = {}
    for name, svc in clients.items():
        env_value = _env(svc).get("SETTLEMENT_CONNECTION_STRING")
        assert env_value, f"{name} lacks SETTLEMENT_CONNECTION_STRING"
        seen[f"{name} env"] = env_value
        arg = _option(_argv(svc), "--connection-string")
        if arg is not None:
            seen[f"{name} --connection-string"] = arg
    assert len(set(seen.values())) == 1, f"connection strings differ: {seen}"
    assert _connection_string_fields(next(iter(seen.values())))["Namespace"]


def test_monitor_service_runs_settlement_monitor(services: dict[str, dict[str, Any]]) -> None:
    assert _argv(services["spark"])[:2] == ["settlement", "monitor"]
    assert "profiles" not in services["spark"], "the monitor runs by default"


def test_dashboard_reads_the_monitors_sink_volume(services: dict[str, dict[str, Any]]) -> None:
    monitor, dashboard = _argv(services["spark"]), _argv(services["dashboard"])
    assert dashboard[:2] == ["settlement", "dashboard"]
    sink = _option(monitor, "--sink")
    assert sink and _option(dashboard, "--sink") == sink
    volume_of = {name: [str(v).split(":")[0] for v in services[name]["volumes"]
                        if str(v).split(":")[1] == sink] for name in ("spark", "dashboard")}
    assert volume_of["spark"] and volume_of["spark"] == volume_of["dashboard"]
    port = _option(dashboard, "--port")
    assert any(str(p).endswith(f":{port}") for p in services["dashboard"]["ports"])


def test_dockerfile_installs_java_17_and_the_package() -> None:
    assert DOCKERFILE.is_file(), "Dockerfile is missing"
    text = DOCKERFILE.read_text()
    assert re.search(r"^FROM python:3\.11-slim\b", text, re.MULTILINE)
    install = re.search(r"apt-get install[^\n]*(\\\n[^\n]*)*", text)
    assert install and "openjdk-17-jre-headless" in install.group(0)
    assert re.search(r"pip install[^\n]*\s\.(\s|$)", text)
    assert _dockerfile_entrypoint() == ["settlement"]


SECURED = ROOT / "docker-compose.secured.yml"


def _merged(base: Any, override: Any) -> Any:
    """What ``docker compose -f base -f override`` runs: mappings merge, the
    rest (commands, lists) is replaced."""
    if isinstance(base, dict) and isinstance(override, dict):
        return {k: _merged(base[k], v) if k in base else v for k, v in override.items()} | {
            k: v for k, v in base.items() if k not in override}
    return override


@pytest.fixture(scope="module")
def secured_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    merged = _merged(compose, yaml.safe_load(SECURED.read_text()))
    services: dict[str, dict[str, Any]] = merged["services"]
    return services


def _jaas_users(jaas: str) -> dict[str, str]:
    return dict(re.findall(r'user_([A-Za-z0-9_-]+)="([^"]*)"', jaas))


def test_secured_profile_authenticates_and_authorizes(
        secured_services: dict[str, dict[str, Any]]) -> None:
    _, kafka = _kafka(secured_services)
    assert kafka["image"] == f"apache/kafka:{KAFKA_VERSION}"
    env = _env(kafka)
    assert env["KAFKA_AUTHORIZER_CLASS_NAME"].endswith("StandardAuthorizer")
    assert set(_listeners(env["KAFKA_ADVERTISED_LISTENERS"])) == {"SASL_PLAINTEXT"}
    assert "User:admin" in env["KAFKA_SUPER_USERS"].split(";")
    users = _jaas_users(env["KAFKA_LISTENER_NAME_SASL_PLAINTEXT_PLAIN_SASL_JAAS_CONFIG"])
    assert {"admin", "engine"} <= set(users)
    for name, svc in secured_services.items():  # every service that talks to Kafka
        if _option(_argv(svc), "--connection-string") is None and name != "acls":
            continue
        conn = _connection_string_fields(_env(svc)["SETTLEMENT_CONNECTION_STRING"])
        user = conn.get("SharedAccessKeyName")
        assert user in users and conn["SharedAccessKey"] == users[user], name
    for name in _workers(secured_services):
        worker = secured_services[name]
        conn = _connection_string_fields(_option(_argv(worker), "--connection-string") or "")
        assert conn["SharedAccessKeyName"] == "engine", name
        assert worker["depends_on"]["acls"]["condition"] == "service_completed_successfully"
    acls = " ".join(_as_argv(secured_services["acls"]["command"]))
    assert "settlement acl User:engine --engine --apply" in acls
    acls_env = _env(secured_services["acls"])
    assert _connection_string_fields(acls_env["SETTLEMENT_CONNECTION_STRING"])[
        "SharedAccessKeyName"] == "admin"
