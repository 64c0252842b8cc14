"""A WASI 0.2 command in Python (world wasi:cli/command): stdin upper-cased to stdout.
"boom" on stdin raises; "spin" never ends."""

import sys

from wit_world import exports


class Run(exports.Run):
    def run(self) -> None:
        data = sys.stdin.buffer.read()
        if data.startswith(b"boom"):
            raise RuntimeError("boom, on purpose")
        if data.startswith(b"spin"):
            while True:
                pass
        sys.stdout.buffer.write(data.upper())
        sys.stdout.flush()
