"""Static checks of docker-compose.yml, docker-compose.secured.yml and the Dockerfile.

Docker is not needed (or available) in CI, so these tests parse the files and
check the properties a deployment silently depends on: a KRaft-mode Kafka
without ZooKeeper, no topic auto-creation, every settlement service pointing
at the broker's advertised listener with one shared connection string, every
KAFKA_* variable turned into the broker setting meant (by the apache/kafka
image's own rule), the secured profile as secured as the tests' Kafka, health
checks, and a base image that has the Java the Dockerfile installs.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from settlement.testing.apache_kafka import (
    BROKER_SETTINGS,
    KAFKA_VERSION,
    KafkaCluster,
    KafkaNode,
    replication_settings,
)
from settlement.testing.tls import CertificateFiles

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


#: The JRE package each Debian release of the python images has
#: (packages.debian.org): bookworm (12) has 17, trixie (13) only 21. A
#: ``python:3.11-slim`` without a release follows Debian's newest, so the
#: Dockerfile must name its release.
DEBIAN_JRE = {"bookworm": "openjdk-17-jre-headless", "trixie": "openjdk-21-jre-headless"}


def test_dockerfile_pins_a_debian_release_that_has_its_java() -> None:
    assert DOCKERFILE.is_file(), "Dockerfile is missing"
    text = DOCKERFILE.read_text()
    base = re.search(r"^FROM python:3\.11-slim-(\w+)\s*$", text, re.MULTILINE)
    assert base, "the base image must name its Debian release (python:3.11-slim-RELEASE)"
    assert base.group(1) in DEBIAN_JRE, f"unknown Debian release {base.group(1)!r}"
    install = re.search(r"apt-get install[^\n]*(\\\n[^\n]*)*", text)
    assert install, "the Dockerfile installs no packages"
    jres = set(re.findall(r"openjdk-\d+-jre-headless", install.group(0)))
    assert jres == {DEBIAN_JRE[base.group(1)]}, (base.group(1), jres)
    assert re.search(r"pip install[^\n]*\s\.(\s|$)", text)
    assert _dockerfile_entrypoint() == ["settlement"]


#: What the apache/kafka image leaves out of the broker's settings
#: (docker/resources/common-scripts/kafka-propertiesSpec.json "excludes").
IMAGE_EXCLUDES = {"KAFKA_VERSION", "KAFKA_HEAP_OPT", "KAFKA_LOG4J_OPTS", "KAFKA_OPTS",
                  "KAFKA_JMX_OPTS", "KAFKA_JVM_PERFORMANCE_OPTS", "KAFKA_GC_LOG_OPTS",
                  "KAFKA_LOG4J_ROOT_LOGLEVEL", "KAFKA_LOG4J_LOGGERS",
                  "KAFKA_TOOLS_LOG4J_LOGLEVEL"}


def image_setting(variable: str) -> str:
    """The broker setting the apache/kafka image makes of ``KAFKA_...``
    (docker/resources/ub ConvertKey): a single ``_`` between two other
    characters becomes ``.``, then ``___`` becomes ``-`` and ``__`` ``_``,
    all in lower case."""
    key = re.sub(r"[^_]_[^_]", lambda m: m.group(0).replace("_", "."),
                 variable.removeprefix("KAFKA_"))
    return key.replace("___", "-").replace("__", "_").lower()


def broker_settings(env: dict[str, str]) -> dict[str, str]:
    return {image_setting(k): v for k, v in env.items()
            if k.startswith("KAFKA_") and k not in IMAGE_EXCLUDES}


def _any_listener(setting: str) -> str:
    return re.sub(r"^listener\.name\.[a-z0-9_-]+\.", "listener.name.*.", setting)


def kafka_of_the_tests(users: bool, tls: bool) -> dict[str, str]:
    """The server.properties of the tests' Kafka, one node (not started)."""
    cluster = KafkaCluster(users={"admin": "a"} if users else None, tls=tls)
    node = KafkaNode(1, 9092, 9093, Path("/kafka"))
    cluster.nodes = [node]
    if tls:
        cluster.certificates = CertificateFiles(Path("/ca.pem"), Path("/server.pem"))
    return cluster.server_properties(node)


def test_the_image_rule_turns_variables_into_settings() -> None:
    assert image_setting("KAFKA_LISTENER_NAME_INTERNAL_PLAIN_SASL_JAAS_CONFIG") == (
        "listener.name.internal.plain.sasl.jaas.config")
    # the variable that named no listener: sasl.plaintext is not sasl_plaintext
    assert image_setting("KAFKA_LISTENER_NAME_SASL_PLAINTEXT_PLAIN_SASL_JAAS_CONFIG") == (
        "listener.name.sasl.plaintext.plain.sasl.jaas.config")
    assert image_setting("KAFKA_LISTENER_NAME_SASL__SSL_PLAIN_SASL_JAAS_CONFIG") == (
        "listener.name.sasl_ssl.plain.sasl.jaas.config")


@pytest.mark.parametrize("profile", ["plain", "secured"])
def test_every_kafka_variable_is_a_setting_of_the_tests_kafka(
        profile: str, services: dict[str, dict[str, Any]],
        secured_services: dict[str, dict[str, Any]]) -> None:
    """Each KAFKA_* variable, as the image reads it, is a setting the tests'
    Kafka also has (so it is spelled right and means what it says), and a
    listener-scoped one names a listener the broker has."""
    _, kafka = _kafka(services if profile == "plain" else secured_services)
    settings = broker_settings(_env(kafka))
    listeners = {name.lower() for name in _listeners(settings["listeners"])}
    known = {_any_listener(k) for users, tls in ((False, False), (True, True))
             for k in kafka_of_the_tests(users, tls)}
    for setting in settings:
        scoped = re.match(r"listener\.name\.([^.]+)\.", setting)
        assert scoped is None or scoped.group(1) in listeners, (
            f"{setting} is for listener {scoped.group(1) if scoped else ''!r}, "
            f"not one of {sorted(listeners)}")
        assert _any_listener(setting) in known, f"{setting} is no setting of the tests' Kafka"


def test_kafka_is_reachable_from_the_host_on_its_own_listener(
        services: dict[str, dict[str, Any]]) -> None:
    _, kafka = _kafka(services)
    advertised = _listeners(_env(kafka)["KAFKA_ADVERTISED_LISTENERS"])
    host = [address for address in advertised.values() if address.startswith("localhost:")]
    assert len(host) == 1, advertised
    port = host[0].rpartition(":")[2]
    assert f"{port}:{port}" in [str(p) for p in kafka["ports"]]


def _health_url(service: dict[str, Any]) -> str:
    test = service["healthcheck"]["test"]
    found = re.search(r"http://127\.0\.0\.1:(\d+)/\S*?(?=['\"])", " ".join(test))
    assert found, f"no HTTP probe in {test}"
    return found.group(0)


def test_workers_and_the_dashboard_have_health_checks(
        services: dict[str, dict[str, Any]]) -> None:
    for name, argv in _workers(services).items():
        port = _option(argv, "--web-port")
        assert port, f"{name} serves no health probe (--web-port)"
        assert _health_url(services[name]) == f"http://127.0.0.1:{port}/"
    dashboard = _argv(services["dashboard"])
    assert _health_url(services["dashboard"]) == (
        f"http://127.0.0.1:{_option(dashboard, '--port')}/metrics.json")


def test_workers_publish_their_prometheus_metrics(
        services: dict[str, dict[str, Any]], secured_services: dict[str, dict[str, Any]]) -> None:
    published = []
    for name, argv in _workers(services).items():
        port = _option(argv, "--metrics-port")
        assert port, f"{name} serves no Prometheus metrics (--metrics-port)"
        published += [str(p).split(":")[0] for p in services[name].get("ports", [])
                      if str(p).endswith(f":{port}")]
        assert _option(_argv(secured_services[name]), "--metrics-port") == port
    assert len(set(published)) == len(_workers(services)), (
        f"each worker's metrics port must be published on its own host port: {published}")


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


def test_secured_profile_is_tls_with_sas_credentials_everywhere(
        secured_services: dict[str, dict[str, Any]]) -> None:
    _, kafka = _kafka(secured_services)
    assert kafka["image"] == f"apache/kafka:{KAFKA_VERSION}"
    settings = broker_settings(_env(kafka))
    assert settings["authorizer.class.name"].endswith("StandardAuthorizer")
    assert settings["super.users"] == "User:admin", "nobody but admin is a super user"
    protocols = dict(item.split(":") for item in
                     settings["listener.security.protocol.map"].split(","))
    advertised = _listeners(settings["advertised.listeners"])
    assert {protocols[name] for name in advertised} == {"SASL_SSL"}
    assert protocols[settings["controller.listener.names"]] == "SASL_PLAINTEXT"
    # every secured setting of the tests' Kafka is here too
    ours = kafka_of_the_tests(users=True, tls=True)
    plain = kafka_of_the_tests(users=False, tls=False)
    secured = {_any_listener(k) for k in ours if k not in plain}
    assert secured <= {_any_listener(k) for k in settings}, secured - {
        _any_listener(k) for k in settings}
    users = _jaas_users(settings["listener.name.internal.plain.sasl.jaas.config"])
    assert {"admin", "engine", "app"} <= set(users)
    for name, svc in secured_services.items():  # every service that talks to Kafka
        if _option(_argv(svc), "--connection-string") is None and name != "acls":
            continue
        conn = _connection_string_fields(_env(svc)["SETTLEMENT_CONNECTION_STRING"])
        assert conn["Endpoint"] == f"kafkas://{advertised['INTERNAL']}", name
        user = conn.get("SharedAccessKeyName")
        assert user in users and conn["SharedAccessKey"] == users[user], name
        ca_dir = conn["CaFile"].rpartition("/")[0]
        assert f"certs:{ca_dir}:ro" in svc["volumes"], f"{name} cannot read {conn['CaFile']}"
    assert "certs:/etc/kafka/secrets:ro" in kafka["volumes"]
    assert settings["ssl.keystore.location"].startswith("/etc/kafka/secrets/")
    certificates = " ".join(_as_argv(secured_services["certificates"]["command"]))
    assert "settlement certificates --out /certs --host kafka --host localhost" in certificates
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
