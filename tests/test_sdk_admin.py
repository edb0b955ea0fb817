"""The administration client as azure-servicebus's: its constructor, its
azure-core errors, its keywords (honoured or refused by name), the dict and
keyword forms of its update calls, the times and ``auto_delete_on_idle`` of
its properties."""

from __future__ import annotations

import datetime as dt
import re
import time
import uuid
from pathlib import Path

import pytest
from azure.core.credentials import AzureNamedKeyCredential
from azure.core.exceptions import HttpResponseError, ResourceExistsError, ResourceNotFoundError

from settlement import ServiceBusClient, ServiceBusMessage
from settlement.cli import main
from settlement.exceptions import MessagingEntityAlreadyExistsError, MessagingEntityNotFoundError
from settlement.management import ServiceBusAdministrationClient, SqlRuleFilter
from streams.process import EngineProcess
from tests.helpers import Broker


def test_missing_entities_are_azure_cores_resource_not_found(
        admin: ServiceBusAdministrationClient, queue_name: str) -> None:
    calls = [lambda: admin.get_queue(queue_name), lambda: admin.delete_queue(queue_name),
             lambda: admin.get_queue_runtime_properties(queue_name),
             lambda: admin.get_topic(queue_name),
             lambda: admin.get_subscription(queue_name, "sub")]
    for call in calls:
        with pytest.raises(ResourceNotFoundError) as caught:
            call()
        assert isinstance(caught.value, MessagingEntityNotFoundError)  # as before
        assert caught.value.status_code == 404
        assert queue_name in caught.value.message


def test_existing_entities_are_azure_cores_resource_exists(
        admin: ServiceBusAdministrationClient, queue_name: str) -> None:
    admin.create_queue(queue_name)
    for call in (lambda: admin.create_queue(queue_name), lambda: admin.create_topic(queue_name)):
        with pytest.raises(ResourceExistsError) as caught:
            call()
        assert isinstance(caught.value, MessagingEntityAlreadyExistsError)
        assert isinstance(caught.value, HttpResponseError) and caught.value.status_code == 409
    admin.delete_queue(queue_name)


def test_sdk_create_options_are_honoured(admin: ServiceBusAdministrationClient,
                                         queue_name: str) -> None:
    before = dt.datetime.now(dt.UTC)
    created = admin.create_queue(
        queue_name, lock_duration="PT30S", max_delivery_count=None,  # None: the default
        auto_delete_on_idle=dt.timedelta(hours=1), user_metadata="team=orders",
        requires_duplicate_detection=True, duplicate_detection_history_time_window="PT2M",
        enable_batched_operations=True, enable_express=False, max_size_in_megabytes=2048,
        authorization_rules=None)
    got = admin.get_queue(queue_name)
    assert got == created
    assert got.lock_duration == dt.timedelta(seconds=30) and got.max_delivery_count == 10
    assert got.auto_delete_on_idle == dt.timedelta(hours=1)
    assert got.duplicate_detection_history_time_window == dt.timedelta(minutes=2)
    assert got.user_metadata == "team=orders" and got.max_size_in_megabytes == 2048
    assert before <= got.created_at_utc == got.updated_at_utc
    runtime = admin.get_queue_runtime_properties(queue_name)
    assert runtime.created_at_utc == got.created_at_utc
    assert runtime.updated_at_utc == got.updated_at_utc
    admin.delete_queue(queue_name)


def test_sdk_options_with_no_effect_here_are_refused_by_name(
        admin: ServiceBusAdministrationClient, queue_name: str) -> None:
    refused = {"enable_express": True, "enable_batched_operations": False,
               "authorization_rules": [object()], "status": "Disabled",
               "http_proxy": {"proxy_hostname": "p"}, "no_such_option": 1}
    for option, value in refused.items():
        with pytest.raises(TypeError, match=f"create_queue.*{option}"):
            admin.create_queue(queue_name, **{option: value})
    with pytest.raises(TypeError, match="filtering_messages_before_publishing"):
        admin.create_topic(queue_name, filtering_messages_before_publishing=True)
    with pytest.raises(TypeError, match="size_in_bytes.*measured"):
        admin.create_topic(queue_name, size_in_bytes=10)
    for call in (lambda: admin.get_queue(queue_name, timeout=5),
                 lambda: admin.list_queues(logging_enable=True),
                 lambda: admin.delete_topic(queue_name, headers={})):
        with pytest.raises(TypeError, match="is not supported here: "):
            call()
    with pytest.raises(TypeError, match="unexpected keyword argument 'queue'"):
        admin.get_queue_runtime_properties(queue_name, queue="typo")
    with pytest.raises(ValueError, match="auto_delete_on_idle must be at least 5 minutes"):
        admin.create_queue(queue_name, auto_delete_on_idle=dt.timedelta(minutes=4))
    assert queue_name not in {q.name for q in admin.list_queues()}


def test_update_takes_the_sdks_keyword_and_dict_forms(admin: ServiceBusAdministrationClient,
                                                      queue_name: str) -> None:
    """As the SDK's mgmt_queue sample: properties, then keywords over them."""
    admin.create_queue(queue_name)
    props = admin.get_queue(queue_name)
    props.max_delivery_count = 5
    admin.update_queue(props)
    assert admin.get_queue(queue_name).max_delivery_count == 5
    admin.update_queue(admin.get_queue(queue_name), max_delivery_count=3,
                       auto_delete_on_idle="PT10M")
    updated = admin.get_queue(queue_name)
    assert (updated.max_delivery_count, updated.auto_delete_on_idle) == (
        3, dt.timedelta(minutes=10))
    assert updated.updated_at_utc > updated.created_at_utc
    admin.update_queue({"name": queue_name, "lock_duration": dt.timedelta(seconds=45)})
    assert admin.get_queue(queue_name).lock_duration == dt.timedelta(seconds=45)
    assert admin.get_queue(queue_name).max_delivery_count == 3  # a dict changes what it names
    with pytest.raises(TypeError, match="enable_express"):
        admin.update_queue(updated, enable_express=True)
    admin.delete_queue(queue_name)


def test_topic_and_subscription_options(admin: ServiceBusAdministrationClient,
                                        queue_name: str) -> None:
    admin.create_topic(queue_name, auto_delete_on_idle="PT1H", user_metadata="m",
                       support_ordering=True, enable_batched_operations=None)
    sub = admin.create_subscription(queue_name, "s", auto_delete_on_idle=dt.timedelta(hours=2),
                                    enable_batched_operations=True, lock_duration="PT20S")
    assert admin.get_topic(queue_name).auto_delete_on_idle == dt.timedelta(hours=1)
    assert sub.auto_delete_on_idle == dt.timedelta(hours=2)
    admin.update_subscription(queue_name, sub, max_delivery_count=4)
    assert admin.get_subscription(queue_name, "s").max_delivery_count == 4
    admin.update_topic({"name": queue_name, "user_metadata": "n"})
    assert admin.get_topic(queue_name).user_metadata == "n"
    assert [r.name for r in admin.list_subscriptions_runtime_properties(queue_name)] == ["s"]
    assert queue_name in {t.name for t in admin.list_topics_runtime_properties()}
    rule = admin.get_rule(queue_name, "s", "$Default")
    admin.update_rule(queue_name, "s", rule, filter=SqlRuleFilter("priority > 1"))
    assert admin.get_rule(queue_name, "s", "$Default").filter.sql_expression == "priority > 1"
    with pytest.raises(TypeError, match="create_subscription.*forward_to_entity"):
        admin.create_subscription(queue_name, "t", forward_to_entity="x")
    admin.delete_topic(queue_name)


def test_the_sdks_constructor_takes_a_namespace_and_credential() -> None:
    credential = AzureNamedKeyCredential("manager", "key")
    with pytest.raises(TypeError, match="api_version.*no Service Bus REST API"):
        ServiceBusAdministrationClient("localhost:9092/ns", credential, api_version="2021-05")
    with pytest.raises(TypeError, match="logging_enable"):
        ServiceBusAdministrationClient.from_connection_string(
            "Endpoint=kafka://localhost:9092;Namespace=ns", logging_enable=True)

    class AzureAdCredential:
        def get_token(self, *scopes: str) -> None:
            raise AssertionError("never asked")

    with pytest.raises(TypeError, match="Azure AD"):
        ServiceBusAdministrationClient("localhost:9092/ns", AzureAdCredential())


def test_entities_idle_for_their_auto_delete_on_idle_are_deleted(broker: Broker,
                                                                  tmp_path: Path) -> None:
    """Service Bus's 5-minute minimum, on an engine whose idle clock runs 60
    times faster (its private test hook): 5 s here. A queue that is sent to
    and a subscription that is read (and so its topic) are kept meanwhile."""
    engine = EngineProcess(broker.connection_string(f"idle{uuid.uuid4().hex[:8]}"), tmp_path,
                           env={"SETTLEMENT_TEST_IDLE_CLOCK_SCALE": "60"}).start()
    idle = dt.timedelta(minutes=5)
    try:
        with (ServiceBusAdministrationClient.from_connection_string(
                engine.connection_string) as admin,
              ServiceBusClient.from_connection_string(engine.connection_string) as client):
            for name in ("unused", "sent-to"):
                admin.create_queue(name, auto_delete_on_idle=idle)
            admin.create_queue("kept-forever")
            admin.create_topic("news", auto_delete_on_idle=idle)
            admin.create_subscription("news", "read", auto_delete_on_idle=idle)
            admin.create_subscription("news", "unread", auto_delete_on_idle=idle)
            sender = client.get_queue_sender("sent-to")
            reader = client.get_subscription_receiver("news", "read", max_wait_time=0.2)
            deadline = time.monotonic() + 9  # 9 minutes of the engine's idle clock
            while time.monotonic() < deadline:
                sender.send_messages(ServiceBusMessage("still here"))
                reader.receive_messages(max_message_count=1, max_wait_time=0.2)
                time.sleep(0.5)
            assert {q.name for q in admin.list_queues()} == {"sent-to", "kept-forever"}
            assert [s.name for s in admin.list_subscriptions("news")] == ["read"]
            with pytest.raises(ResourceNotFoundError):
                admin.get_queue("unused")
            sender.close()
            reader.close()
            deadline = time.monotonic() + 15  # now nothing uses them: they go too
            while time.monotonic() < deadline and (admin.list_topics()
                                                   or len(admin.list_queues()) > 1):
                time.sleep(0.5)
            assert [q.name for q in admin.list_queues()] == ["kept-forever"]
            assert admin.list_topics() == []
    finally:
        engine.stop()
    assert "deleting queue 'unused': idle for" in engine.log_path.read_text()


def test_the_cli_sets_and_shows_auto_delete_on_idle(conn: str, queue_name: str,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    cs = ("--connection-string", conn)
    assert main(["queue", "create", queue_name, "--auto-delete-on-idle", "600", *cs]) == 0
    assert main(["queue", "update", queue_name, "--auto-delete-on-idle", "900", *cs]) == 0
    capsys.readouterr()
    assert main(["queue", "show", queue_name, *cs]) == 0
    out = capsys.readouterr().out
    assert re.search(r"^auto_delete_on_idle\s+900s$", out, re.MULTILINE), out
    assert re.search(r"^updated_at_utc\s+\d{4}-", out, re.MULTILINE), out
    assert main(["queue", "update", queue_name, "--auto-delete-on-idle", "60", *cs]) != 0
    assert "at least 5 minutes" in capsys.readouterr().err
    assert main(["queue", "delete", queue_name, *cs]) == 0
