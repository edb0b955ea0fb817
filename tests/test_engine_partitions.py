"""A namespace's engine partitions: set when it is made (``settlement
namespace create --engine-partitions N``, ``create_namespace(engine_partitions=)``),
8 by default, fixed afterwards; its engine workers size themselves by them.

Three workers sharing a namespace, one killed, are in test_cluster_faults.py.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from settlement import ServiceBusClient, ServiceBusMessage
from settlement.cli import main
from settlement.management import ServiceBusAdministrationClient
from streams.process import EngineProcess
from tests.helpers import Broker, drain_ids, shared_partitions
from topics import names, specs
from topics.connection import parse_connection_string
from topics.entities import NamespaceProperties, validate_engine_partitions
from topics.entities.definition import load_definition


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("count", [1, 8, 256])
def test_engine_partitions_from_1_to_256_are_valid(count: int) -> None:
    assert validate_engine_partitions(count) == count


@pytest.mark.parametrize("count", [0, -1, 257, True, 2.5, "3"])
def test_other_engine_partitions_are_refused_saying_the_range(count: object) -> None:
    with pytest.raises(ValueError, match="from 1 to 256"):
        validate_engine_partitions(count)  # type: ignore[arg-type]  # wrong on purpose


def test_the_namespace_record_leaves_the_engine_partitions_to_kafka() -> None:
    stored = NamespaceProperties("ns", 50, engine_partitions=3).to_json()
    assert "engine_partitions" not in json.loads(stored)
    assert load_definition(stored) == NamespaceProperties(
        "ns", 50, updated_at_utc=load_definition(stored).updated_at_utc)


def test_namespace_create_refuses_a_bad_count_before_calling_kafka(
        capsys: pytest.CaptureFixture[str]) -> None:
    nowhere = ("--connection-string", "Endpoint=kafka://127.0.0.1:1;Namespace=ns")
    code, _, err = run(capsys, "namespace", "create", "--engine-partitions", "0", *nowhere)
    assert code == 2 and "engine_partitions must be a whole number from 1 to 256" in err
    code, _, err = run(capsys, "namespace", "create", "--engine-partitions", "many", *nowhere)
    assert code == 2 and "invalid int value: 'many'" in err


@pytest.mark.tansu
def test_a_namespace_made_with_3_engine_partitions_is_served_by_them(
        broker: Broker, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    conn = broker.connection_string(f"three{uuid.uuid4().hex[:6]}")
    cs = ("--connection-string", conn, "--output", "json")
    code, out, err = run(capsys, "namespace", "create", "--engine-partitions", "3", *cs)
    assert code == 0, err
    assert json.loads(out)["engine_partitions"] == 3
    namespace = parse_connection_string(conn).namespace
    kafka = AdminClient(parse_connection_string(conn).kafka_config())
    shared = [names.commands(namespace), names.events(namespace), names.state(namespace)]
    assert [specs.partition_count(kafka, t) for t in shared] == [3] * 3
    assert run(capsys, "namespace", "create", "--engine-partitions", "3", *cs)[0] == 0
    code, _, err = run(capsys, "namespace", "create", "--engine-partitions", "4", *cs)
    assert code == 2 and "exists with 3 engine partitions, not 4" in err

    engine = EngineProcess(conn, tmp_path).start()
    admin = ServiceBusAdministrationClient.from_connection_string(conn)
    client = ServiceBusClient.from_connection_string(conn)
    try:
        assert shared_partitions([engine], 3, 20) == [{0, 1, 2}]
        # the engine makes its tables' changelogs, co-partitioned with the commands
        assert [specs.partition_count(kafka, names.table_changelog(namespace, t))
                for t in specs.ENGINE_TABLES] == [3] * 2
        assert admin.get_namespace_properties().engine_partitions == 3
        admin.create_queue("jobs", lock_duration=5, partition_count=4)  # windows on 0 and 1
        with client.get_queue_sender("jobs") as sender:
            sender.send_messages([ServiceBusMessage(f"job {i}", message_id=str(i))
                                  for i in range(20)])
        assert sorted(drain_ids(client, "jobs"), key=int) == [str(i) for i in range(20)]
        assert admin.get_queue_runtime_properties("jobs").active_message_count == 0
    finally:
        client.close()
        admin.close()
        engine.stop()
