"""The shipped rewrite rules under their public name: ``transforms.rewrite_rules`` is
``transforms.rewrite.rules`` (where they are defined and documented)."""

from transforms.rewrite.rules import *
from transforms.rewrite.rules import __all__  # noqa: F401
