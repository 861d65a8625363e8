"""The two error kinds the ``cascade`` CLI tells apart from a plain failure (exit 1).

Raise :class:`UsageError` for a command line that cannot be acted on (exit 2) and
:class:`NotReady` when something the action needs is not there yet: a service that is down, an
input an earlier step has not written (exit 3). The message is one line that names the fix.
"""

from __future__ import annotations


class UsageError(ValueError):
    """A command line the command cannot act on (exit 2)."""


class NotReady(RuntimeError):
    """A service the command needs is down, or an input does not exist yet (exit 3)."""


class NothingLanded(NotReady):
    """A scheduled or event-started run whose partition has no landed data: the run ends as
    skipped ("nothing landed for DS") and trains, registers and promotes nothing. Land the data
    with ``cascade land`` (exit 3 from ``cascade step``)."""
