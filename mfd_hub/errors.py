"""Errors a user can act on. The CLI prints them as one line and exits non-zero."""


class MfdHubError(Exception):
    """A known failure with a message meant for the user (one line, no traceback)."""

    exit_code = 1


class UsageError(MfdHubError):
    """The command was called wrongly (bad option values, missing inputs)."""

    exit_code = 2
