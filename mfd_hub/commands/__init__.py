"""The CLI's commands, one module each; ``COMMANDS`` is what ``mfd-hub`` registers."""

from .generate import generate
from .info import info

COMMANDS = [generate, info]
