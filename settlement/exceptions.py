"""Errors of the settlement layer, named as in ``azure.servicebus.exceptions``.

Every error says what went wrong and what to do. ``retryable`` tells whether
the same call may succeed if tried again; ``error_code`` and ``tracking_id``
identify a rejection as a Service Bus rejection would.

The administration client raises what the SDK's raises, azure-core's HTTP
errors: ``ResourceNotFoundError`` for a missing entity, ``ResourceExistsError``
for an existing one, ``ClientAuthenticationError`` for a refused credential
or a missing Manage right (Service Bus answers both 401). Rather than
separate types for the administration client, the errors of those kinds
subclass both their ``ServiceBusError`` and the azure-core class, so code
written for either catches them (``except ResourceNotFoundError`` as in the
SDK's samples, ``except MessagingEntityNotFoundError`` as before), and carry
the HTTP status the SDK's would (``status_code``).

The engine refuses a command with a code (``topics.errors.ErrorCode``);
:func:`for_code` names the error each code raises.
"""

from __future__ import annotations

import uuid

from azure.core.exceptions import (
    ClientAuthenticationError,
    ResourceExistsError,
    ResourceNotFoundError,
)

from topics.errors import ErrorCode


class ServiceBusError(Exception):
    """Base of every error raised by the settlement layer."""

    retryable_default = False
    #: the HTTP status of the SDK's azure-core error of the same kind, if any
    _status_code: int | None = None
    #: set only on the errors that are also azure-core's (which declares it so)
    status_code: int | None

    def __init__(self, message: str, *, error_code: str | None = None,
                 tracking_id: str | None = None, retryable: bool | None = None) -> None:
        error_code = error_code or type(self).__name__
        tracking_id = tracking_id or uuid.uuid4().hex
        # First: azure-core's __init__ (of the errors that are also one) sets
        # ``message`` and ``status_code`` itself.
        super().__init__(f"{message} (error: {error_code}, tracking id: {tracking_id})")
        self.error_code = error_code
        self.tracking_id = tracking_id
        self.retryable = self.retryable_default if retryable is None else retryable
        self.message = message
        if self._status_code is not None:
            self.status_code = self._status_code


class ServiceBusConnectionError(ServiceBusError):
    """Kafka could not be reached; check the Endpoint of the connection string."""

    retryable_default = True


class ServiceBusCommunicationError(ServiceBusError):
    """A request to Kafka failed on the way; retrying may help."""

    retryable_default = True


class OperationTimeoutError(ServiceBusError):
    """No answer in time (the engine may be restarting); retrying may help."""

    retryable_default = True


class ServiceBusServerBusyError(ServiceBusError):
    """The namespace is over its limit of engine commands per second. Wait
    at least 10 seconds before trying that entity again (the clients do)."""

    retryable_default = True


class ServiceBusQuotaExceededError(ServiceBusError):
    """The entity is full (``max_size_in_megabytes``): receive or delete
    messages, or raise the quota. Retrying the same send does not help."""


#: the names the issue tracker and the seeds use
ServerBusyError = ServiceBusServerBusyError
QuotaExceededError = ServiceBusQuotaExceededError


class ServiceBusAuthorizationError(ServiceBusError, ClientAuthenticationError):
    """The principal lacks the right (Send, Listen or Manage) for what it asked,
    or asked for what only the engine itself may do. Also azure-core's
    ``ClientAuthenticationError``: what the SDK's administration client raises
    (Service Bus answers 401 to a missing Manage claim)."""

    _status_code = 401


class ServiceBusAuthenticationError(ServiceBusError, ClientAuthenticationError):
    """The broker did not accept the connection's credentials: a wrong key
    name or key, or a shared access signature that is invalid or expired.
    Also azure-core's ``ClientAuthenticationError``, as the SDK's
    administration client raises."""

    _status_code = 401


#: librdkafka error names of a refusal by the broker's authorizer
_DENIED = frozenset({"TOPIC_AUTHORIZATION_FAILED", "GROUP_AUTHORIZATION_FAILED",
                     "CLUSTER_AUTHORIZATION_FAILED"})
#: librdkafka error names of credentials the broker did not accept
_UNAUTHENTICATED = frozenset({"SASL_AUTHENTICATION_FAILED", "_AUTHENTICATION"})


def denied(error_name: str, needs: str, scope: str
           ) -> ServiceBusAuthorizationError | ServiceBusAuthenticationError | None:
    """The error to raise when Kafka refused the credentials, or its
    authorizer refused what needs ``needs`` ("the Send right") on ``scope``
    ("queue 'orders'"); None for errors of another kind."""
    if error_name in _UNAUTHENTICATED:
        return ServiceBusAuthenticationError(
            f"the broker did not accept this connection's credentials for {scope} (Kafka "
            f"answered {error_name}): check SharedAccessKeyName/SharedAccessKey, the named "
            "key credential, or renew the shared access signature if it expired",
            error_code="Unauthorized")
    if error_name not in _DENIED:
        return None
    return ServiceBusAuthorizationError(
        f"the principal of this connection string lacks {needs} on {scope} (Kafka answered "
        f"{error_name}): check SharedAccessKeyName/SharedAccessKey, or have the right granted "
        "('settlement acl PRINCIPAL --right RIGHT [--entity NAME] --apply')",
        error_code="Unauthorized")


class MessageSizeExceededError(ServiceBusError, ValueError):
    """A message is larger than its entity accepts."""


class MessageLockLostError(ServiceBusError):
    """The lock on the message expired or is held under another token."""


class SessionLockLostError(ServiceBusError):
    """The session lock lapsed or was given up; the locks of the messages
    received under it went with it. Open a new session receiver."""


class SessionCannotBeLockedError(ServiceBusError):
    """Another receiver holds the session's lock; try again once it closes
    or its lock lapses."""

    retryable_default = True


class MessageNotFoundError(ServiceBusError):
    pass


class MessagingEntityNotFoundError(ServiceBusError, ResourceNotFoundError):
    """The entity (queue, topic, subscription or rule) does not exist in this
    namespace. Also azure-core's ``ResourceNotFoundError``, which the SDK's
    administration client raises."""

    _status_code = 404


class MessagingEntityAlreadyExistsError(ServiceBusError, ResourceExistsError):
    """An entity of that name exists already. Also azure-core's
    ``ResourceExistsError``, which the SDK's administration client raises."""

    _status_code = 409


class InvalidOperationError(ServiceBusError):
    """The operation is not allowed for this message or entity."""


class AutoLockRenewFailed(ServiceBusError):
    pass


class AutoLockRenewTimeout(ServiceBusError):
    pass


class MessageAlreadySettled(ValueError):
    """The message was settled already; a message is settled once."""

    retryable = False

    def __init__(self, action: str = "settle") -> None:
        super().__init__(
            f"Unable to {action}: the message has already been settled "
            "(completed, abandoned, dead-lettered or deferred)."
        )


#: the error each of the engine's refusal codes raises
_BY_CODE: dict[ErrorCode, type[ServiceBusError]] = {
    ErrorCode.BAD_COMMAND: ServiceBusError,
    ErrorCode.UNAUTHORIZED: ServiceBusAuthorizationError,
    ErrorCode.MISROUTED: ServiceBusError,
    ErrorCode.SERVER_BUSY: ServiceBusServerBusyError,
    ErrorCode.MESSAGING_ENTITY_NOT_FOUND: MessagingEntityNotFoundError,
    ErrorCode.STATE_TOO_LARGE: ServiceBusError,
    ErrorCode.STATE_UNREADABLE: ServiceBusError,
    ErrorCode.SESSION_REQUIRED: InvalidOperationError,
    ErrorCode.INVALID_OPERATION: InvalidOperationError,
    ErrorCode.SESSION_LOCK_LOST: SessionLockLostError,
}


def for_code(code: str) -> type[ServiceBusError]:
    """The error to raise for the engine's refusal ``code`` (``Reply.error_code``);
    ``ServiceBusError`` for a code this client does not know."""
    try:
        return _BY_CODE[ErrorCode(code)]
    except ValueError:
        return ServiceBusError
