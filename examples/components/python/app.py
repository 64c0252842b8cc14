"""A TensorWasm function in Python: typed exports of a WASI 0.2 component (../calc.wit)."""

import math

import wit_world


class WitWorld(wit_world.WitWorld):
    def add(self, a: int, b: int) -> int:
        return a + b

    def norm(self, p: wit_world.Point) -> float:
        return math.hypot(p.x, p.y)

    def greet(self, name: str) -> str:
        return f"hello, {name}"

    def words(self, text: str) -> tuple[int, int]:
        found = text.split()
        return (len(set(found)), len(found))

    def boom(self) -> None:
        raise RuntimeError("boom, on purpose")

    def spin(self) -> None:
        while True:
            pass

    def hog(self, mib: int) -> int:
        held = bytearray(mib << 20)
        return len(held) >> 20
