"""Errors a user can act on. The CLI prints them as one line and exits non-zero."""


class MfdHubError(Exception):
    """A known failure with a message meant for the user (one line, no traceback)."""

    exit_code = 1


class UsageError(MfdHubError):
    """The command was called wrongly (bad option values, missing inputs)."""

    exit_code = 2


class DrafterNameNote(UserWarning):
    """A drafter name that could mean two things was resolved by the documented rule (the CLI
    prints it as one ``note:`` line on stderr)."""
