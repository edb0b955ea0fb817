"""The codes the engine answers a refused command with (``Reply.error_code``).

The client turns each into one exception class
(``settlement.exceptions.for_code``); a test checks that every code here has one.
"""

from __future__ import annotations

from enum import StrEnum


class ErrorCode(StrEnum):
    #: the record does not follow ``topics.commands``' format
    BAD_COMMAND = "BadCommand"
    #: an operation of the engine itself or of an entity definition, or a
    #: command carrying a policy
    UNAUTHORIZED = "Unauthorized"
    #: keyed or partitioned for another window than the one it names
    MISROUTED = "Misrouted"
    #: over the namespace's limit of commands per second, before it ran:
    #: the same command may be sent again (clients wait 10 s first)
    SERVER_BUSY = "ServerBusy"
    #: the subscription the command names has no definition
    MESSAGING_ENTITY_NOT_FOUND = "MessagingEntityNotFound"
    #: what the command would store for its window is too large for one record
    STATE_TOO_LARGE = "StateTooLarge"
    #: the stored state of the window cannot be read
    STATE_UNREADABLE = "StateUnreadable"
    #: a plain receive on an entity that requires sessions
    SESSION_REQUIRED = "SessionRequired"
    #: a session operation on an entity without sessions
    INVALID_OPERATION = "InvalidOperation"
    #: the session lock the command's token names is no longer held
    SESSION_LOCK_LOST = "SessionLockLost"
