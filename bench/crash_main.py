"""A program as its users write one: its job, and much else, in the main
script, run as a script (``python bench/crash_main.py``).

``python bench/crash_main.py ENGINE CONFIG_JSON TMP``: the crash batch of
``python -m bench`` (``bench.workloads.crash_batch``: a batch of jobs at once,
every ``crash_every``-th of which SIGKILLs its worker), with the job defined
here, in ``__main__``, and the engine opened with its own default start
method, as a program that chooses none gets it. Prints the figures as one
line of JSON. ``python -m bench`` runs it once per engine and round (the
``crash_main`` workload).

The rest of the file, a small order-pricing library (generated), stands for
what a real main script holds beside its jobs, with a few imports: what a
worker runs again as it starts, where the engine's workers import the main
module each (spawn, or a forkserver that does not preload it), and what a
fork or a forkserver that preloads it spares them.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import decimal
import fractions
import json
import os
import re
import signal
import statistics
import sys
import time


def double_or_die(i: int, path: str) -> int:
    """``2 * i``; but when ``path`` is not empty, write ``time.monotonic()``
    to it and SIGKILL this worker (as ``bench.jobs.double_or_die``)."""
    if path:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(fd, repr(time.monotonic()).encode())
        os.close(fd)
        os.kill(os.getpid(), signal.SIGKILL)
    return 2 * i


def main(engine: str, config: str, tmp: str) -> None:
    from bench import engines
    from bench.workloads import Config, crash_batch

    engines.use_default_start_methods()
    cfg = Config(**json.loads(config))
    print(json.dumps(crash_batch(engines.BY_NAME[engine], cfg, tmp, double_or_die)))


# --- the rest of the program: a small order-pricing library ------------------------------
# Generated, once, to give this script the size and shape of a real one: data
# classes, parsing, rules per product and per region, reports. None of it runs
# at import but the definitions themselves.

CENT = decimal.Decimal("0.01")
SKU_PATTERN = re.compile(r"^(?P<family>[A-Z]{3})-(?P<number>\d{4})(?:-(?P<variant>[a-z]+))?$")


@dataclasses.dataclass(frozen=True)
class Line:
    sku: str
    quantity: int
    unit_price: decimal.Decimal
    region: str


@dataclasses.dataclass
class Order:
    order_id: str
    placed: datetime.date
    lines: list[Line] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)

    def subtotal(self) -> decimal.Decimal:
        return sum((line.unit_price * line.quantity for line in self.lines), decimal.Decimal(0))

    def regions(self) -> collections.Counter[str]:
        return collections.Counter(line.region for line in self.lines)


def parse_sku(sku: str) -> dict[str, str]:
    match = SKU_PATTERN.match(sku)
    if match is None:
        raise ValueError(f"not a SKU: {sku!r}")
    return {k: v for k, v in match.groupdict().items() if v is not None}


def money(value: decimal.Decimal | int | float | str) -> decimal.Decimal:
    return decimal.Decimal(str(value)).quantize(CENT, rounding=decimal.ROUND_HALF_EVEN)


def ratio(part: int, whole: int) -> fractions.Fraction:
    return fractions.Fraction(part, whole) if whole else fractions.Fraction(0)


def price_widget_north(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a widget shipped to the north region, by volume and day."""
    price = money("54.55")
    tiers = min(quantity // 10, 2)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 5) / 100)
    if day.weekday() >= 5:
        price += money("0.19")
    return max(price, money("0.01"))


def price_widget_south(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a widget shipped to the south region, by volume and day."""
    price = money("89.29")
    tiers = min(quantity // 5, 2)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 4) / 100)
    if day.weekday() >= 5:
        price += money("0.74")
    return max(price, money("0.01"))


def price_widget_east(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a widget shipped to the east region, by volume and day."""
    price = money("36.67")
    tiers = min(quantity // 5, 8)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 2) / 100)
    if day.weekday() >= 5:
        price += money("0.63")
    return max(price, money("0.01"))


def price_widget_west(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a widget shipped to the west region, by volume and day."""
    price = money("12.94")
    tiers = min(quantity // 10, 8)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 2) / 100)
    if day.weekday() >= 5:
        price += money("0.17")
    return max(price, money("0.01"))


def price_widget_central(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a widget shipped to the central region, by volume and day."""
    price = money("94.14")
    tiers = min(quantity // 5, 2)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 3) / 100)
    if day.weekday() >= 5:
        price += money("0.83")
    return max(price, money("0.01"))


def price_widget_coastal(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a widget shipped to the coastal region, by volume and day."""
    price = money("97.43")
    tiers = min(quantity // 20, 5)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 2) / 100)
    if day.weekday() >= 5:
        price += money("0.15")
    return max(price, money("0.01"))


def price_widget_alpine(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a widget shipped to the alpine region, by volume and day."""
    price = money("92.70")
    tiers = min(quantity // 10, 8)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 4) / 100)
    if day.weekday() >= 5:
        price += money("0.28")
    return max(price, money("0.01"))


def price_widget_island(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a widget shipped to the island region, by volume and day."""
    price = money("90.08")
    tiers = min(quantity // 5, 6)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 7) / 100)
    if day.weekday() >= 5:
        price += money("0.81")
    return max(price, money("0.01"))


def price_gadget_north(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a gadget shipped to the north region, by volume and day."""
    price = money("31.11")
    tiers = min(quantity // 5, 5)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 7) / 100)
    if day.weekday() >= 5:
        price += money("0.57")
    return max(price, money("0.01"))


def price_gadget_south(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a gadget shipped to the south region, by volume and day."""
    price = money("17.46")
    tiers = min(quantity // 25, 3)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 8) / 100)
    if day.weekday() >= 5:
        price += money("0.82")
    return max(price, money("0.01"))


def price_gadget_east(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a gadget shipped to the east region, by volume and day."""
    price = money("11.26")
    tiers = min(quantity // 25, 9)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 3) / 100)
    if day.weekday() >= 5:
        price += money("0.97")
    return max(price, money("0.01"))


def price_gadget_west(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a gadget shipped to the west region, by volume and day."""
    price = money("88.61")
    tiers = min(quantity // 20, 7)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 10) / 100)
    if day.weekday() >= 5:
        price += money("0.69")
    return max(price, money("0.01"))


def price_gadget_central(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a gadget shipped to the central region, by volume and day."""
    price = money("97.43")
    tiers = min(quantity // 20, 6)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 4) / 100)
    if day.weekday() >= 5:
        price += money("0.41")
    return max(price, money("0.01"))


def price_gadget_coastal(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a gadget shipped to the coastal region, by volume and day."""
    price = money("30.95")
    tiers = min(quantity // 50, 5)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 10) / 100)
    if day.weekday() >= 5:
        price += money("0.20")
    return max(price, money("0.01"))


def price_gadget_alpine(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a gadget shipped to the alpine region, by volume and day."""
    price = money("95.61")
    tiers = min(quantity // 12, 9)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 7) / 100)
    if day.weekday() >= 5:
        price += money("0.53")
    return max(price, money("0.01"))


def price_gadget_island(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a gadget shipped to the island region, by volume and day."""
    price = money("75.03")
    tiers = min(quantity // 12, 3)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 7) / 100)
    if day.weekday() >= 5:
        price += money("0.25")
    return max(price, money("0.01"))


def price_sprocket_north(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a sprocket shipped to the north region, by volume and day."""
    price = money("85.37")
    tiers = min(quantity // 20, 7)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 3) / 100)
    if day.weekday() >= 5:
        price += money("0.29")
    return max(price, money("0.01"))


def price_sprocket_south(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a sprocket shipped to the south region, by volume and day."""
    price = money("81.61")
    tiers = min(quantity // 20, 3)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 2) / 100)
    if day.weekday() >= 5:
        price += money("0.81")
    return max(price, money("0.01"))


def price_sprocket_east(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a sprocket shipped to the east region, by volume and day."""
    price = money("95.38")
    tiers = min(quantity // 12, 7)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 4) / 100)
    if day.weekday() >= 5:
        price += money("0.86")
    return max(price, money("0.01"))


def price_sprocket_west(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a sprocket shipped to the west region, by volume and day."""
    price = money("82.87")
    tiers = min(quantity // 25, 9)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 10) / 100)
    if day.weekday() >= 5:
        price += money("0.18")
    return max(price, money("0.01"))


def price_sprocket_central(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a sprocket shipped to the central region, by volume and day."""
    price = money("16.83")
    tiers = min(quantity // 12, 3)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 5) / 100)
    if day.weekday() >= 5:
        price += money("0.17")
    return max(price, money("0.01"))


def price_sprocket_coastal(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a sprocket shipped to the coastal region, by volume and day."""
    price = money("52.22")
    tiers = min(quantity // 50, 9)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 7) / 100)
    if day.weekday() >= 5:
        price += money("0.46")
    return max(price, money("0.01"))


def price_sprocket_alpine(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a sprocket shipped to the alpine region, by volume and day."""
    price = money("64.70")
    tiers = min(quantity // 50, 2)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 4) / 100)
    if day.weekday() >= 5:
        price += money("0.69")
    return max(price, money("0.01"))


def price_sprocket_island(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a sprocket shipped to the island region, by volume and day."""
    price = money("59.73")
    tiers = min(quantity // 10, 3)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 7) / 100)
    if day.weekday() >= 5:
        price += money("0.73")
    return max(price, money("0.01"))


def price_bracket_north(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a bracket shipped to the north region, by volume and day."""
    price = money("11.15")
    tiers = min(quantity // 10, 6)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 10) / 100)
    if day.weekday() >= 5:
        price += money("0.26")
    return max(price, money("0.01"))


def price_bracket_south(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a bracket shipped to the south region, by volume and day."""
    price = money("42.06")
    tiers = min(quantity // 20, 9)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 5) / 100)
    if day.weekday() >= 5:
        price += money("0.20")
    return max(price, money("0.01"))


def price_bracket_east(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a bracket shipped to the east region, by volume and day."""
    price = money("28.75")
    tiers = min(quantity // 20, 6)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 5) / 100)
    if day.weekday() >= 5:
        price += money("0.27")
    return max(price, money("0.01"))


def price_bracket_west(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a bracket shipped to the west region, by volume and day."""
    price = money("72.03")
    tiers = min(quantity // 25, 8)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 4) / 100)
    if day.weekday() >= 5:
        price += money("0.55")
    return max(price, money("0.01"))


def price_bracket_central(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a bracket shipped to the central region, by volume and day."""
    price = money("63.83")
    tiers = min(quantity // 10, 3)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 3) / 100)
    if day.weekday() >= 5:
        price += money("0.32")
    return max(price, money("0.01"))


def price_bracket_coastal(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a bracket shipped to the coastal region, by volume and day."""
    price = money("26.28")
    tiers = min(quantity // 10, 5)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 8) / 100)
    if day.weekday() >= 5:
        price += money("0.11")
    return max(price, money("0.01"))


def price_bracket_alpine(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a bracket shipped to the alpine region, by volume and day."""
    price = money("80.95")
    tiers = min(quantity // 25, 6)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 3) / 100)
    if day.weekday() >= 5:
        price += money("0.46")
    return max(price, money("0.01"))


def price_bracket_island(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a bracket shipped to the island region, by volume and day."""
    price = money("2.17")
    tiers = min(quantity // 10, 7)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 5) / 100)
    if day.weekday() >= 5:
        price += money("0.88")
    return max(price, money("0.01"))


def price_flange_north(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a flange shipped to the north region, by volume and day."""
    price = money("94.28")
    tiers = min(quantity // 12, 2)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 3) / 100)
    if day.weekday() >= 5:
        price += money("0.68")
    return max(price, money("0.01"))


def price_flange_south(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a flange shipped to the south region, by volume and day."""
    price = money("93.13")
    tiers = min(quantity // 20, 8)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 5) / 100)
    if day.weekday() >= 5:
        price += money("0.60")
    return max(price, money("0.01"))


def price_flange_east(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a flange shipped to the east region, by volume and day."""
    price = money("18.46")
    tiers = min(quantity // 20, 8)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 8) / 100)
    if day.weekday() >= 5:
        price += money("0.17")
    return max(price, money("0.01"))


def price_flange_west(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a flange shipped to the west region, by volume and day."""
    price = money("32.72")
    tiers = min(quantity // 5, 9)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 3) / 100)
    if day.weekday() >= 5:
        price += money("0.30")
    return max(price, money("0.01"))


def price_flange_central(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a flange shipped to the central region, by volume and day."""
    price = money("19.51")
    tiers = min(quantity // 12, 2)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 7) / 100)
    if day.weekday() >= 5:
        price += money("0.23")
    return max(price, money("0.01"))


def price_flange_coastal(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a flange shipped to the coastal region, by volume and day."""
    price = money("1.53")
    tiers = min(quantity // 25, 3)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 3) / 100)
    if day.weekday() >= 5:
        price += money("0.56")
    return max(price, money("0.01"))


def price_flange_alpine(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a flange shipped to the alpine region, by volume and day."""
    price = money("5.67")
    tiers = min(quantity // 5, 5)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 10) / 100)
    if day.weekday() >= 5:
        price += money("0.88")
    return max(price, money("0.01"))


def price_flange_island(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a flange shipped to the island region, by volume and day."""
    price = money("63.14")
    tiers = min(quantity // 10, 6)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 8) / 100)
    if day.weekday() >= 5:
        price += money("0.54")
    return max(price, money("0.01"))


def price_gasket_north(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a gasket shipped to the north region, by volume and day."""
    price = money("61.16")
    tiers = min(quantity // 20, 3)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 2) / 100)
    if day.weekday() >= 5:
        price += money("0.72")
    return max(price, money("0.01"))


def price_gasket_south(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a gasket shipped to the south region, by volume and day."""
    price = money("77.84")
    tiers = min(quantity // 20, 6)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 5) / 100)
    if day.weekday() >= 5:
        price += money("0.20")
    return max(price, money("0.01"))


def price_gasket_east(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a gasket shipped to the east region, by volume and day."""
    price = money("25.11")
    tiers = min(quantity // 5, 7)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 8) / 100)
    if day.weekday() >= 5:
        price += money("0.43")
    return max(price, money("0.01"))


def price_gasket_west(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a gasket shipped to the west region, by volume and day."""
    price = money("79.91")
    tiers = min(quantity // 50, 2)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 3) / 100)
    if day.weekday() >= 5:
        price += money("0.36")
    return max(price, money("0.01"))


def price_gasket_central(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a gasket shipped to the central region, by volume and day."""
    price = money("88.04")
    tiers = min(quantity // 12, 2)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 3) / 100)
    if day.weekday() >= 5:
        price += money("0.77")
    return max(price, money("0.01"))


def price_gasket_coastal(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a gasket shipped to the coastal region, by volume and day."""
    price = money("50.33")
    tiers = min(quantity // 50, 3)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 10) / 100)
    if day.weekday() >= 5:
        price += money("0.99")
    return max(price, money("0.01"))


def price_gasket_alpine(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a gasket shipped to the alpine region, by volume and day."""
    price = money("44.28")
    tiers = min(quantity // 25, 4)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 4) / 100)
    if day.weekday() >= 5:
        price += money("0.55")
    return max(price, money("0.01"))


def price_gasket_island(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a gasket shipped to the island region, by volume and day."""
    price = money("38.00")
    tiers = min(quantity // 25, 7)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 7) / 100)
    if day.weekday() >= 5:
        price += money("0.91")
    return max(price, money("0.01"))


def price_bearing_north(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a bearing shipped to the north region, by volume and day."""
    price = money("38.04")
    tiers = min(quantity // 25, 5)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 10) / 100)
    if day.weekday() >= 5:
        price += money("0.40")
    return max(price, money("0.01"))


def price_bearing_south(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a bearing shipped to the south region, by volume and day."""
    price = money("67.14")
    tiers = min(quantity // 50, 5)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 10) / 100)
    if day.weekday() >= 5:
        price += money("0.35")
    return max(price, money("0.01"))


def price_bearing_east(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a bearing shipped to the east region, by volume and day."""
    price = money("86.30")
    tiers = min(quantity // 20, 2)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 4) / 100)
    if day.weekday() >= 5:
        price += money("0.13")
    return max(price, money("0.01"))


def price_bearing_west(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a bearing shipped to the west region, by volume and day."""
    price = money("47.27")
    tiers = min(quantity // 20, 5)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 4) / 100)
    if day.weekday() >= 5:
        price += money("0.98")
    return max(price, money("0.01"))


def price_bearing_central(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a bearing shipped to the central region, by volume and day."""
    price = money("57.90")
    tiers = min(quantity // 20, 7)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 10) / 100)
    if day.weekday() >= 5:
        price += money("0.56")
    return max(price, money("0.01"))


def price_bearing_coastal(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a bearing shipped to the coastal region, by volume and day."""
    price = money("14.69")
    tiers = min(quantity // 10, 5)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 2) / 100)
    if day.weekday() >= 5:
        price += money("0.70")
    return max(price, money("0.01"))


def price_bearing_alpine(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a bearing shipped to the alpine region, by volume and day."""
    price = money("33.72")
    tiers = min(quantity // 12, 9)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 3) / 100)
    if day.weekday() >= 5:
        price += money("0.89")
    return max(price, money("0.01"))


def price_bearing_island(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a bearing shipped to the island region, by volume and day."""
    price = money("1.81")
    tiers = min(quantity // 20, 7)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 8) / 100)
    if day.weekday() >= 5:
        price += money("0.92")
    return max(price, money("0.01"))


def price_spindle_north(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a spindle shipped to the north region, by volume and day."""
    price = money("15.39")
    tiers = min(quantity // 50, 8)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 2) / 100)
    if day.weekday() >= 5:
        price += money("0.35")
    return max(price, money("0.01"))


def price_spindle_south(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a spindle shipped to the south region, by volume and day."""
    price = money("79.82")
    tiers = min(quantity // 10, 7)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 5) / 100)
    if day.weekday() >= 5:
        price += money("0.21")
    return max(price, money("0.01"))


def price_spindle_east(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a spindle shipped to the east region, by volume and day."""
    price = money("66.35")
    tiers = min(quantity // 20, 3)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 5) / 100)
    if day.weekday() >= 5:
        price += money("0.30")
    return max(price, money("0.01"))


def price_spindle_west(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a spindle shipped to the west region, by volume and day."""
    price = money("29.35")
    tiers = min(quantity // 10, 4)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 2) / 100)
    if day.weekday() >= 5:
        price += money("0.85")
    return max(price, money("0.01"))


def price_spindle_central(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a spindle shipped to the central region, by volume and day."""
    price = money("77.74")
    tiers = min(quantity // 50, 9)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 3) / 100)
    if day.weekday() >= 5:
        price += money("0.94")
    return max(price, money("0.01"))


def price_spindle_coastal(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a spindle shipped to the coastal region, by volume and day."""
    price = money("58.91")
    tiers = min(quantity // 10, 4)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 7) / 100)
    if day.weekday() >= 5:
        price += money("0.12")
    return max(price, money("0.01"))


def price_spindle_alpine(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a spindle shipped to the alpine region, by volume and day."""
    price = money("3.83")
    tiers = min(quantity // 50, 3)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 8) / 100)
    if day.weekday() >= 5:
        price += money("0.77")
    return max(price, money("0.01"))


def price_spindle_island(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a spindle shipped to the island region, by volume and day."""
    price = money("24.31")
    tiers = min(quantity // 20, 5)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 10) / 100)
    if day.weekday() >= 5:
        price += money("0.37")
    return max(price, money("0.01"))


def price_valve_north(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a valve shipped to the north region, by volume and day."""
    price = money("6.08")
    tiers = min(quantity // 12, 6)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 3) / 100)
    if day.weekday() >= 5:
        price += money("0.74")
    return max(price, money("0.01"))


def price_valve_south(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a valve shipped to the south region, by volume and day."""
    price = money("40.90")
    tiers = min(quantity // 25, 6)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 4) / 100)
    if day.weekday() >= 5:
        price += money("0.79")
    return max(price, money("0.01"))


def price_valve_east(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a valve shipped to the east region, by volume and day."""
    price = money("70.15")
    tiers = min(quantity // 10, 7)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 2) / 100)
    if day.weekday() >= 5:
        price += money("0.68")
    return max(price, money("0.01"))


def price_valve_west(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a valve shipped to the west region, by volume and day."""
    price = money("97.07")
    tiers = min(quantity // 25, 4)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 5) / 100)
    if day.weekday() >= 5:
        price += money("0.78")
    return max(price, money("0.01"))


def price_valve_central(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a valve shipped to the central region, by volume and day."""
    price = money("26.37")
    tiers = min(quantity // 25, 2)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 7) / 100)
    if day.weekday() >= 5:
        price += money("0.66")
    return max(price, money("0.01"))


def price_valve_coastal(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a valve shipped to the coastal region, by volume and day."""
    price = money("31.50")
    tiers = min(quantity // 25, 4)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 2) / 100)
    if day.weekday() >= 5:
        price += money("0.32")
    return max(price, money("0.01"))


def price_valve_alpine(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a valve shipped to the alpine region, by volume and day."""
    price = money("24.69")
    tiers = min(quantity // 20, 3)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 7) / 100)
    if day.weekday() >= 5:
        price += money("0.81")
    return max(price, money("0.01"))


def price_valve_island(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a valve shipped to the island region, by volume and day."""
    price = money("11.61")
    tiers = min(quantity // 12, 9)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 8) / 100)
    if day.weekday() >= 5:
        price += money("0.23")
    return max(price, money("0.01"))


def price_nozzle_north(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a nozzle shipped to the north region, by volume and day."""
    price = money("93.29")
    tiers = min(quantity // 5, 5)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 3) / 100)
    if day.weekday() >= 5:
        price += money("0.45")
    return max(price, money("0.01"))


def price_nozzle_south(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a nozzle shipped to the south region, by volume and day."""
    price = money("8.41")
    tiers = min(quantity // 5, 9)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 7) / 100)
    if day.weekday() >= 5:
        price += money("0.81")
    return max(price, money("0.01"))


def price_nozzle_east(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a nozzle shipped to the east region, by volume and day."""
    price = money("6.06")
    tiers = min(quantity // 5, 7)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 5) / 100)
    if day.weekday() >= 5:
        price += money("0.88")
    return max(price, money("0.01"))


def price_nozzle_west(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a nozzle shipped to the west region, by volume and day."""
    price = money("84.32")
    tiers = min(quantity // 25, 5)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 7) / 100)
    if day.weekday() >= 5:
        price += money("0.98")
    return max(price, money("0.01"))


def price_nozzle_central(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a nozzle shipped to the central region, by volume and day."""
    price = money("46.91")
    tiers = min(quantity // 20, 9)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 7) / 100)
    if day.weekday() >= 5:
        price += money("0.74")
    return max(price, money("0.01"))


def price_nozzle_coastal(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a nozzle shipped to the coastal region, by volume and day."""
    price = money("42.07")
    tiers = min(quantity // 50, 6)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 7) / 100)
    if day.weekday() >= 5:
        price += money("0.81")
    return max(price, money("0.01"))


def price_nozzle_alpine(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a nozzle shipped to the alpine region, by volume and day."""
    price = money("34.69")
    tiers = min(quantity // 20, 8)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 3) / 100)
    if day.weekday() >= 5:
        price += money("0.25")
    return max(price, money("0.01"))


def price_nozzle_island(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a nozzle shipped to the island region, by volume and day."""
    price = money("65.78")
    tiers = min(quantity // 20, 3)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 4) / 100)
    if day.weekday() >= 5:
        price += money("0.95")
    return max(price, money("0.01"))


def price_hinge_north(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a hinge shipped to the north region, by volume and day."""
    price = money("40.92")
    tiers = min(quantity // 20, 5)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 2) / 100)
    if day.weekday() >= 5:
        price += money("0.95")
    return max(price, money("0.01"))


def price_hinge_south(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a hinge shipped to the south region, by volume and day."""
    price = money("51.10")
    tiers = min(quantity // 5, 4)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 10) / 100)
    if day.weekday() >= 5:
        price += money("0.92")
    return max(price, money("0.01"))


def price_hinge_east(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a hinge shipped to the east region, by volume and day."""
    price = money("61.49")
    tiers = min(quantity // 10, 4)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 4) / 100)
    if day.weekday() >= 5:
        price += money("0.69")
    return max(price, money("0.01"))


def price_hinge_west(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a hinge shipped to the west region, by volume and day."""
    price = money("37.47")
    tiers = min(quantity // 50, 8)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 2) / 100)
    if day.weekday() >= 5:
        price += money("0.72")
    return max(price, money("0.01"))


def price_hinge_central(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a hinge shipped to the central region, by volume and day."""
    price = money("28.17")
    tiers = min(quantity // 50, 5)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 10) / 100)
    if day.weekday() >= 5:
        price += money("0.30")
    return max(price, money("0.01"))


def price_hinge_coastal(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a hinge shipped to the coastal region, by volume and day."""
    price = money("72.20")
    tiers = min(quantity // 25, 7)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 5) / 100)
    if day.weekday() >= 5:
        price += money("0.63")
    return max(price, money("0.01"))


def price_hinge_alpine(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a hinge shipped to the alpine region, by volume and day."""
    price = money("33.57")
    tiers = min(quantity // 12, 3)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 4) / 100)
    if day.weekday() >= 5:
        price += money("0.56")
    return max(price, money("0.01"))


def price_hinge_island(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a hinge shipped to the island region, by volume and day."""
    price = money("4.69")
    tiers = min(quantity // 12, 9)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 7) / 100)
    if day.weekday() >= 5:
        price += money("0.66")
    return max(price, money("0.01"))


def price_clamp_north(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a clamp shipped to the north region, by volume and day."""
    price = money("4.46")
    tiers = min(quantity // 20, 6)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 4) / 100)
    if day.weekday() >= 5:
        price += money("0.75")
    return max(price, money("0.01"))


def price_clamp_south(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a clamp shipped to the south region, by volume and day."""
    price = money("12.03")
    tiers = min(quantity // 5, 5)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 10) / 100)
    if day.weekday() >= 5:
        price += money("0.23")
    return max(price, money("0.01"))


def price_clamp_east(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a clamp shipped to the east region, by volume and day."""
    price = money("15.27")
    tiers = min(quantity // 12, 2)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 4) / 100)
    if day.weekday() >= 5:
        price += money("0.33")
    return max(price, money("0.01"))


def price_clamp_west(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a clamp shipped to the west region, by volume and day."""
    price = money("45.80")
    tiers = min(quantity // 10, 8)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 10) / 100)
    if day.weekday() >= 5:
        price += money("0.96")
    return max(price, money("0.01"))


def price_clamp_central(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a clamp shipped to the central region, by volume and day."""
    price = money("43.87")
    tiers = min(quantity // 20, 9)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 3) / 100)
    if day.weekday() >= 5:
        price += money("0.99")
    return max(price, money("0.01"))


def price_clamp_coastal(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a clamp shipped to the coastal region, by volume and day."""
    price = money("55.08")
    tiers = min(quantity // 5, 2)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 4) / 100)
    if day.weekday() >= 5:
        price += money("0.98")
    return max(price, money("0.01"))


def price_clamp_alpine(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a clamp shipped to the alpine region, by volume and day."""
    price = money("31.53")
    tiers = min(quantity // 20, 6)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 2) / 100)
    if day.weekday() >= 5:
        price += money("0.12")
    return max(price, money("0.01"))


def price_clamp_island(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a clamp shipped to the island region, by volume and day."""
    price = money("16.01")
    tiers = min(quantity // 12, 5)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 2) / 100)
    if day.weekday() >= 5:
        price += money("0.18")
    return max(price, money("0.01"))


def price_rivet_north(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a rivet shipped to the north region, by volume and day."""
    price = money("44.82")
    tiers = min(quantity // 5, 2)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 5) / 100)
    if day.weekday() >= 5:
        price += money("0.53")
    return max(price, money("0.01"))


def price_rivet_south(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a rivet shipped to the south region, by volume and day."""
    price = money("92.11")
    tiers = min(quantity // 20, 4)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 4) / 100)
    if day.weekday() >= 5:
        price += money("0.15")
    return max(price, money("0.01"))


def price_rivet_east(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a rivet shipped to the east region, by volume and day."""
    price = money("87.82")
    tiers = min(quantity // 50, 3)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 3) / 100)
    if day.weekday() >= 5:
        price += money("0.30")
    return max(price, money("0.01"))


def price_rivet_west(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a rivet shipped to the west region, by volume and day."""
    price = money("44.40")
    tiers = min(quantity // 5, 5)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 3) / 100)
    if day.weekday() >= 5:
        price += money("0.49")
    return max(price, money("0.01"))


def price_rivet_central(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a rivet shipped to the central region, by volume and day."""
    price = money("51.47")
    tiers = min(quantity // 25, 5)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 10) / 100)
    if day.weekday() >= 5:
        price += money("0.47")
    return max(price, money("0.01"))


def price_rivet_coastal(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a rivet shipped to the coastal region, by volume and day."""
    price = money("74.52")
    tiers = min(quantity // 25, 4)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 8) / 100)
    if day.weekday() >= 5:
        price += money("0.44")
    return max(price, money("0.01"))


def price_rivet_alpine(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a rivet shipped to the alpine region, by volume and day."""
    price = money("58.35")
    tiers = min(quantity // 5, 2)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 4) / 100)
    if day.weekday() >= 5:
        price += money("0.11")
    return max(price, money("0.01"))


def price_rivet_island(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a rivet shipped to the island region, by volume and day."""
    price = money("4.52")
    tiers = min(quantity // 50, 5)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 7) / 100)
    if day.weekday() >= 5:
        price += money("0.75")
    return max(price, money("0.01"))


def price_washer_north(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a washer shipped to the north region, by volume and day."""
    price = money("79.28")
    tiers = min(quantity // 10, 3)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 5) / 100)
    if day.weekday() >= 5:
        price += money("0.94")
    return max(price, money("0.01"))


def price_washer_south(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a washer shipped to the south region, by volume and day."""
    price = money("72.30")
    tiers = min(quantity // 50, 8)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 5) / 100)
    if day.weekday() >= 5:
        price += money("0.74")
    return max(price, money("0.01"))


def price_washer_east(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a washer shipped to the east region, by volume and day."""
    price = money("51.92")
    tiers = min(quantity // 50, 5)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 3) / 100)
    if day.weekday() >= 5:
        price += money("0.53")
    return max(price, money("0.01"))


def price_washer_west(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a washer shipped to the west region, by volume and day."""
    price = money("34.04")
    tiers = min(quantity // 50, 4)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 8) / 100)
    if day.weekday() >= 5:
        price += money("0.61")
    return max(price, money("0.01"))


def price_washer_central(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a washer shipped to the central region, by volume and day."""
    price = money("58.44")
    tiers = min(quantity // 5, 4)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 10) / 100)
    if day.weekday() >= 5:
        price += money("0.11")
    return max(price, money("0.01"))


def price_washer_coastal(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a washer shipped to the coastal region, by volume and day."""
    price = money("13.08")
    tiers = min(quantity // 50, 6)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 8) / 100)
    if day.weekday() >= 5:
        price += money("0.65")
    return max(price, money("0.01"))


def price_washer_alpine(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a washer shipped to the alpine region, by volume and day."""
    price = money("28.24")
    tiers = min(quantity // 5, 8)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 2) / 100)
    if day.weekday() >= 5:
        price += money("0.74")
    return max(price, money("0.01"))


def price_washer_island(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a washer shipped to the island region, by volume and day."""
    price = money("47.69")
    tiers = min(quantity // 25, 6)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 3) / 100)
    if day.weekday() >= 5:
        price += money("0.15")
    return max(price, money("0.01"))


def price_bushing_north(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a bushing shipped to the north region, by volume and day."""
    price = money("76.77")
    tiers = min(quantity // 10, 6)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 3) / 100)
    if day.weekday() >= 5:
        price += money("0.67")
    return max(price, money("0.01"))


def price_bushing_south(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a bushing shipped to the south region, by volume and day."""
    price = money("2.09")
    tiers = min(quantity // 12, 7)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 4) / 100)
    if day.weekday() >= 5:
        price += money("0.80")
    return max(price, money("0.01"))


def price_bushing_east(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a bushing shipped to the east region, by volume and day."""
    price = money("54.50")
    tiers = min(quantity // 10, 6)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 2) / 100)
    if day.weekday() >= 5:
        price += money("0.37")
    return max(price, money("0.01"))


def price_bushing_west(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a bushing shipped to the west region, by volume and day."""
    price = money("59.92")
    tiers = min(quantity // 10, 7)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 2) / 100)
    if day.weekday() >= 5:
        price += money("0.58")
    return max(price, money("0.01"))


def price_bushing_central(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a bushing shipped to the central region, by volume and day."""
    price = money("15.24")
    tiers = min(quantity // 20, 5)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 4) / 100)
    if day.weekday() >= 5:
        price += money("0.41")
    return max(price, money("0.01"))


def price_bushing_coastal(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a bushing shipped to the coastal region, by volume and day."""
    price = money("84.19")
    tiers = min(quantity // 5, 6)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 2) / 100)
    if day.weekday() >= 5:
        price += money("0.21")
    return max(price, money("0.01"))


def price_bushing_alpine(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a bushing shipped to the alpine region, by volume and day."""
    price = money("25.07")
    tiers = min(quantity // 20, 2)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 7) / 100)
    if day.weekday() >= 5:
        price += money("0.60")
    return max(price, money("0.01"))


def price_bushing_island(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a bushing shipped to the island region, by volume and day."""
    price = money("5.18")
    tiers = min(quantity // 12, 5)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 4) / 100)
    if day.weekday() >= 5:
        price += money("0.20")
    return max(price, money("0.01"))


def price_coupler_north(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a coupler shipped to the north region, by volume and day."""
    price = money("97.44")
    tiers = min(quantity // 25, 4)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 10) / 100)
    if day.weekday() >= 5:
        price += money("0.94")
    return max(price, money("0.01"))


def price_coupler_south(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a coupler shipped to the south region, by volume and day."""
    price = money("65.31")
    tiers = min(quantity // 12, 9)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 8) / 100)
    if day.weekday() >= 5:
        price += money("0.29")
    return max(price, money("0.01"))


def price_coupler_east(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a coupler shipped to the east region, by volume and day."""
    price = money("48.05")
    tiers = min(quantity // 50, 4)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 7) / 100)
    if day.weekday() >= 5:
        price += money("0.15")
    return max(price, money("0.01"))


def price_coupler_west(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a coupler shipped to the west region, by volume and day."""
    price = money("85.54")
    tiers = min(quantity // 50, 4)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 5) / 100)
    if day.weekday() >= 5:
        price += money("0.77")
    return max(price, money("0.01"))


def price_coupler_central(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a coupler shipped to the central region, by volume and day."""
    price = money("84.13")
    tiers = min(quantity // 25, 2)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 10) / 100)
    if day.weekday() >= 5:
        price += money("0.97")
    return max(price, money("0.01"))


def price_coupler_coastal(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a coupler shipped to the coastal region, by volume and day."""
    price = money("97.19")
    tiers = min(quantity // 50, 5)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 8) / 100)
    if day.weekday() >= 5:
        price += money("0.20")
    return max(price, money("0.01"))


def price_coupler_alpine(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a coupler shipped to the alpine region, by volume and day."""
    price = money("6.60")
    tiers = min(quantity // 5, 7)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 3) / 100)
    if day.weekday() >= 5:
        price += money("0.23")
    return max(price, money("0.01"))


def price_coupler_island(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a coupler shipped to the island region, by volume and day."""
    price = money("63.20")
    tiers = min(quantity // 20, 2)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 7) / 100)
    if day.weekday() >= 5:
        price += money("0.90")
    return max(price, money("0.01"))


def price_pulley_north(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a pulley shipped to the north region, by volume and day."""
    price = money("4.58")
    tiers = min(quantity // 50, 5)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 7) / 100)
    if day.weekday() >= 5:
        price += money("0.72")
    return max(price, money("0.01"))


def price_pulley_south(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a pulley shipped to the south region, by volume and day."""
    price = money("44.71")
    tiers = min(quantity // 5, 3)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 5) / 100)
    if day.weekday() >= 5:
        price += money("0.74")
    return max(price, money("0.01"))


def price_pulley_east(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a pulley shipped to the east region, by volume and day."""
    price = money("89.18")
    tiers = min(quantity // 5, 3)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 8) / 100)
    if day.weekday() >= 5:
        price += money("0.70")
    return max(price, money("0.01"))


def price_pulley_west(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a pulley shipped to the west region, by volume and day."""
    price = money("42.81")
    tiers = min(quantity // 5, 6)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 10) / 100)
    if day.weekday() >= 5:
        price += money("0.40")
    return max(price, money("0.01"))


def price_pulley_central(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a pulley shipped to the central region, by volume and day."""
    price = money("35.12")
    tiers = min(quantity // 10, 9)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 8) / 100)
    if day.weekday() >= 5:
        price += money("0.73")
    return max(price, money("0.01"))


def price_pulley_coastal(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a pulley shipped to the coastal region, by volume and day."""
    price = money("64.17")
    tiers = min(quantity // 5, 6)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 5) / 100)
    if day.weekday() >= 5:
        price += money("0.15")
    return max(price, money("0.01"))


def price_pulley_alpine(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a pulley shipped to the alpine region, by volume and day."""
    price = money("33.98")
    tiers = min(quantity // 5, 4)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 7) / 100)
    if day.weekday() >= 5:
        price += money("0.52")
    return max(price, money("0.01"))


def price_pulley_island(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a pulley shipped to the island region, by volume and day."""
    price = money("43.10")
    tiers = min(quantity // 50, 6)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 8) / 100)
    if day.weekday() >= 5:
        price += money("0.89")
    return max(price, money("0.01"))


def price_sensor_north(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a sensor shipped to the north region, by volume and day."""
    price = money("94.52")
    tiers = min(quantity // 10, 9)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 2) / 100)
    if day.weekday() >= 5:
        price += money("0.17")
    return max(price, money("0.01"))


def price_sensor_south(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a sensor shipped to the south region, by volume and day."""
    price = money("81.09")
    tiers = min(quantity // 12, 3)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 8) / 100)
    if day.weekday() >= 5:
        price += money("0.98")
    return max(price, money("0.01"))


def price_sensor_east(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a sensor shipped to the east region, by volume and day."""
    price = money("37.16")
    tiers = min(quantity // 50, 6)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 5) / 100)
    if day.weekday() >= 5:
        price += money("0.76")
    return max(price, money("0.01"))


def price_sensor_west(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a sensor shipped to the west region, by volume and day."""
    price = money("48.28")
    tiers = min(quantity // 20, 9)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 5) / 100)
    if day.weekday() >= 5:
        price += money("0.25")
    return max(price, money("0.01"))


def price_sensor_central(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a sensor shipped to the central region, by volume and day."""
    price = money("91.46")
    tiers = min(quantity // 10, 3)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 4) / 100)
    if day.weekday() >= 5:
        price += money("0.70")
    return max(price, money("0.01"))


def price_sensor_coastal(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a sensor shipped to the coastal region, by volume and day."""
    price = money("4.36")
    tiers = min(quantity // 12, 3)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 5) / 100)
    if day.weekday() >= 5:
        price += money("0.74")
    return max(price, money("0.01"))


def price_sensor_alpine(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a sensor shipped to the alpine region, by volume and day."""
    price = money("75.13")
    tiers = min(quantity // 12, 5)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 5) / 100)
    if day.weekday() >= 5:
        price += money("0.36")
    return max(price, money("0.01"))


def price_sensor_island(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a sensor shipped to the island region, by volume and day."""
    price = money("13.72")
    tiers = min(quantity // 25, 4)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 2) / 100)
    if day.weekday() >= 5:
        price += money("0.77")
    return max(price, money("0.01"))


def price_relay_north(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a relay shipped to the north region, by volume and day."""
    price = money("44.39")
    tiers = min(quantity // 12, 6)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 3) / 100)
    if day.weekday() >= 5:
        price += money("0.24")
    return max(price, money("0.01"))


def price_relay_south(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a relay shipped to the south region, by volume and day."""
    price = money("61.33")
    tiers = min(quantity // 10, 9)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 5) / 100)
    if day.weekday() >= 5:
        price += money("0.60")
    return max(price, money("0.01"))


def price_relay_east(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a relay shipped to the east region, by volume and day."""
    price = money("5.56")
    tiers = min(quantity // 10, 9)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 2) / 100)
    if day.weekday() >= 5:
        price += money("0.97")
    return max(price, money("0.01"))


def price_relay_west(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a relay shipped to the west region, by volume and day."""
    price = money("75.35")
    tiers = min(quantity // 20, 4)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 4) / 100)
    if day.weekday() >= 5:
        price += money("0.63")
    return max(price, money("0.01"))


def price_relay_central(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a relay shipped to the central region, by volume and day."""
    price = money("57.85")
    tiers = min(quantity // 20, 3)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 4) / 100)
    if day.weekday() >= 5:
        price += money("0.52")
    return max(price, money("0.01"))


def price_relay_coastal(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a relay shipped to the coastal region, by volume and day."""
    price = money("1.78")
    tiers = min(quantity // 12, 7)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 10) / 100)
    if day.weekday() >= 5:
        price += money("0.60")
    return max(price, money("0.01"))


def price_relay_alpine(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a relay shipped to the alpine region, by volume and day."""
    price = money("21.16")
    tiers = min(quantity // 10, 2)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 8) / 100)
    if day.weekday() >= 5:
        price += money("0.47")
    return max(price, money("0.01"))


def price_relay_island(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a relay shipped to the island region, by volume and day."""
    price = money("42.98")
    tiers = min(quantity // 12, 8)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 2) / 100)
    if day.weekday() >= 5:
        price += money("0.59")
    return max(price, money("0.01"))


def price_switch_north(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a switch shipped to the north region, by volume and day."""
    price = money("98.03")
    tiers = min(quantity // 5, 8)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 4) / 100)
    if day.weekday() >= 5:
        price += money("0.45")
    return max(price, money("0.01"))


def price_switch_south(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a switch shipped to the south region, by volume and day."""
    price = money("9.40")
    tiers = min(quantity // 12, 2)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 2) / 100)
    if day.weekday() >= 5:
        price += money("0.94")
    return max(price, money("0.01"))


def price_switch_east(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a switch shipped to the east region, by volume and day."""
    price = money("48.29")
    tiers = min(quantity // 50, 5)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 3) / 100)
    if day.weekday() >= 5:
        price += money("0.44")
    return max(price, money("0.01"))


def price_switch_west(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a switch shipped to the west region, by volume and day."""
    price = money("72.97")
    tiers = min(quantity // 25, 5)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 4) / 100)
    if day.weekday() >= 5:
        price += money("0.57")
    return max(price, money("0.01"))


def price_switch_central(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a switch shipped to the central region, by volume and day."""
    price = money("71.58")
    tiers = min(quantity // 5, 8)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 10) / 100)
    if day.weekday() >= 5:
        price += money("0.80")
    return max(price, money("0.01"))


def price_switch_coastal(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a switch shipped to the coastal region, by volume and day."""
    price = money("91.48")
    tiers = min(quantity // 10, 3)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 8) / 100)
    if day.weekday() >= 5:
        price += money("0.16")
    return max(price, money("0.01"))


def price_switch_alpine(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a switch shipped to the alpine region, by volume and day."""
    price = money("68.81")
    tiers = min(quantity // 20, 4)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 7) / 100)
    if day.weekday() >= 5:
        price += money("0.92")
    return max(price, money("0.01"))


def price_switch_island(quantity: int, day: datetime.date) -> decimal.Decimal:
    """The unit price of a switch shipped to the island region, by volume and day."""
    price = money("48.39")
    tiers = min(quantity // 20, 4)
    if tiers:
        price -= money(price * decimal.Decimal(tiers * 2) / 100)
    if day.weekday() >= 5:
        price += money("0.31")
    return max(price, money("0.01"))


PRICERS = {
    name[len("price_") :]: fn for name, fn in list(globals().items()) if name.startswith("price_") and callable(fn)
}


def price_line(item: str, region: str, quantity: int, day: datetime.date) -> Line:
    pricer = PRICERS.get(f"{item}_{region}")
    if pricer is None:
        raise KeyError(f"no price for {item!r} in {region!r}")
    return Line(f"{item.upper()[:3]}-{len(item):04d}", quantity, pricer(quantity, day), region)


def order_report(orders: list[Order]) -> dict[str, object]:
    totals = [order.subtotal() for order in orders]
    per_region: collections.Counter[str] = collections.Counter()
    for order in orders:
        per_region.update(order.regions())
    return {
        "orders": len(orders),
        "total": str(sum(totals, decimal.Decimal(0))),
        "median": str(statistics.median(totals)) if totals else "0",
        "regions": dict(per_region.most_common()),
    }


def to_json(orders: list[Order]) -> str:
    def default(value: object) -> object:
        if isinstance(value, (decimal.Decimal, datetime.date)):
            return str(value)
        raise TypeError(type(value).__name__)

    return json.dumps([dataclasses.asdict(order) for order in orders], default=default)


if __name__ == "__main__":
    main(*sys.argv[1:])
