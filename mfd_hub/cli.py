"""The ``mfd-hub`` command line: a click group whose commands live in ``mfd_hub.commands``.

``main`` is the one place that turns errors into output: a known error (``MfdHubError``, a click
usage error) becomes one ``error: ...`` line on stderr and a non-zero exit code; anything
unexpected becomes one ``internal error`` line (``MFD_HUB_DEBUG=1`` shows the traceback). A
``DrafterNameNote`` (a drafter name resolved by the ambiguity rule) becomes one ``note: ...`` line.
"""

import contextlib
import os
import sys
import warnings

import click

from .version import __version__
from .commands._common import examples
from .errors import DrafterNameNote, MfdHubError

EXIT_INTERNAL = 3
EXIT_INTERRUPTED = 130


def one_line(text):
    return " ".join(str(text).split())


@click.group(
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog=examples(
        "mfd-hub demo",
        "mfd-hub info ./MFD-Qwen3-8B --json",
        "mfd-hub generate --drafter ./drafter --target Qwen/Qwen3-8B --method mixture 'Hello'",
    ),
)
@click.version_option(__version__, prog_name="mfd-hub")
@click.pass_context
def cli(ctx):
    """Multi-Future Drafting drafters: run, check, convert, train and publish them."""
    ctx.with_resource(_notes_on_stderr())


@contextlib.contextmanager
def _notes_on_stderr():
    """While a command runs, each DrafterNameNote warning is one 'note: ...' line on stderr."""
    with warnings.catch_warnings():
        others = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None):
            if issubclass(category, DrafterNameNote):
                click.echo(f"note: {one_line(message)}", err=True)
            else:
                others(message, category, filename, lineno, file, line)

        warnings.showwarning = show
        warnings.simplefilter("default", DrafterNameNote)
        yield


def _register_commands():
    from .commands import COMMANDS

    for command in COMMANDS:
        cli.add_command(command)


_register_commands()


def main(argv=None):
    try:
        cli.main(args=argv, prog_name="mfd-hub", standalone_mode=False)
    except click.exceptions.Exit as done:
        sys.exit(done.exit_code)
    except click.Abort:
        click.echo("error: aborted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except click.ClickException as err:
        hint = ""
        ctx = getattr(err, "ctx", None)
        if ctx is not None:
            hint = f" (see '{ctx.command_path} --help')"
        click.echo(f"error: {one_line(err.format_message())}{hint}", err=True)
        sys.exit(err.exit_code)
    except MfdHubError as err:
        click.echo(f"error: {one_line(err)}", err=True)
        sys.exit(err.exit_code)
    except KeyboardInterrupt:
        click.echo("error: interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
    except Exception as err:  # the last resort: still one line, unless debugging
        if os.environ.get("MFD_HUB_DEBUG"):
            raise
        click.echo(
            f"internal error: {type(err).__name__}: {one_line(err)} (set MFD_HUB_DEBUG=1 for the traceback)",
            err=True,
        )
        sys.exit(EXIT_INTERNAL)
