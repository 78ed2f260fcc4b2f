"""The CLI's commands, one module each; ``COMMANDS`` is what ``mfd-hub`` registers."""

from .generate import generate
from .info import info
from .regen import regen
from .train import train

COMMANDS = [generate, info, regen, train]
