"""A plugin module that exits the interpreter when imported (it must not take the host down)."""

import sys

RLK_PLUGIN_API = "2.0"
sys.exit(3)
