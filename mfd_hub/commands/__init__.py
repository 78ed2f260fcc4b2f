"""The CLI's commands, one module each; ``COMMANDS`` is what ``mfd-hub`` registers."""

from .info import info

COMMANDS = [info]
