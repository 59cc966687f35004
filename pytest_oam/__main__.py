"""``python -m pytest_oam``: the ``oam`` command."""

from .cli import console_main

console_main()
