"""The CLI's commands, one module each; ``COMMANDS`` is what ``mfd-hub`` registers."""

from .bench import bench
from .card import card
from .convert import convert
from .demo import demo
from .drafters import list_drafters
from .evaluate import evaluate
from .generate import generate
from .info import info
from .push import push
from .regen import regen
from .train import train
from .verify import verify

COMMANDS = [bench, card, convert, demo, evaluate, generate, info, list_drafters, push, regen, train, verify]
