"""How a command takes a drafter: one spelling (the DRAFTER argument, or the ``--drafter``
option), three forms, the same words in every --help. The name is resolved by
``mfd_hub.locate.resolve_drafter`` and nowhere else."""

import inspect

import click

from ..zoo.shipped import SHIPPED_DRAFTERS

FORMS = ("a checkpoint folder, a Hub repo id (owner/name) or a shipped drafter's name "
         f"({', '.join(SHIPPED_DRAFTERS)})")
RULE = "A bare shipped name means the shipped drafter even where a folder of that name exists (./NAME is the folder)."


def drafter_help(what):
    """--help text of an option that takes a drafter: ``what`` and the three forms."""
    return f"{what}: {FORMS}."


def drafter_argument(name="drafter", metavar="DRAFTER", nargs=1):
    """A command's drafter argument (a decorator); its forms are appended to the command's help.
    ``nargs=-1``: any number of drafters (the command checks that one was given)."""

    def decorate(function):
        doc = inspect.cleandoc(function.__doc__ or "")
        each = "Each DRAFTER" if nargs != 1 else metavar
        function.__doc__ = f"{doc}\n\n{each} is {FORMS}. {RULE}"
        return click.argument(name, metavar=metavar, nargs=nargs)(function)

    return decorate


def given_drafter(drafter, old_spelling, old_flag="--draft"):
    """The drafter of a command whose ``--drafter`` once was ``old_flag`` (kept hidden, deprecated)."""
    if drafter is not None and old_spelling is not None:
        raise click.UsageError(f"{old_flag} is the old spelling of --drafter: give only --drafter")
    if old_spelling is not None:
        click.echo(f"note: {old_flag} is deprecated, write --drafter", err=True)
        return old_spelling
    if drafter is None:
        raise click.UsageError("Missing option '--drafter'.")
    return drafter
