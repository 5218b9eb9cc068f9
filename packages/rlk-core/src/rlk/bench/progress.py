"""Progress while the suite runs: a tqdm bar on a terminal, else one line per row on stderr.

Logs (CI, the GPU script's tee) get plain lines, which read better than a redrawn bar.
"""

from __future__ import annotations

import sys
from typing import Any, TextIO


class Progress:
    def __init__(self, total: int, stream: TextIO | None = None):
        self.total = total
        self.count = 0
        self.stream = stream or sys.stderr
        self.label = ""
        self._bar: Any = None
        if not self.stream.isatty():
            return
        try:
            from tqdm import tqdm
        except ImportError:
            return
        self._bar = tqdm(total=total, file=self.stream, unit="row", dynamic_ncols=True)

    def start(self, label: str) -> None:
        self.label = label
        if self._bar is not None:
            self._bar.set_description_str(label)

    def done(self, status: str) -> None:
        self.count += 1
        if self._bar is not None:
            self._bar.set_postfix_str(status)
            self._bar.update(1)
        else:
            print(f"[{self.count}/{self.total}] {self.label}: {status}", file=self.stream,
                  flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
