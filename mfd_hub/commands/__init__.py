"""The CLI's commands, one module each; ``COMMANDS`` is what ``mfd-hub`` registers."""

from .convert import convert
from .generate import generate
from .info import info
from .regen import regen
from .verify import verify

COMMANDS = [convert, generate, info, regen, verify]
