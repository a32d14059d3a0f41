"""The `hanlm` command: parse, load the configuration, call the stage. Nothing else.

parser.py holds the arguments (the subcommands, and CONFIG_FLAGS: which config keys each one
takes as flags), commands.py the commands' bodies, process.py the process around one command
(its exit status, its error line, the stop signals).
"""

from hanlm.cli.parser import build_parser
from hanlm.cli.process import main

__all__ = ["build_parser", "main"]
