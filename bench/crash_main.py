"""A program as its users write one: its job, and much else, in the main
script, run as a script (``python bench/crash_main.py``).

``python bench/crash_main.py ENGINE CONFIG_JSON TMP``: the crash batch of
``python -m bench`` (``bench.workloads.crash_batch``: a batch of jobs at once,
every ``crash_every``-th of which SIGKILLs its worker), with the job defined
here, in ``__main__``, and the engine opened with its own default start
method, as a program that chooses none gets it. Prints the figures as one
line of JSON. ``python -m bench`` runs it once per engine and round (the
``crash_main`` workload).

The rest of the file, a small order-pricing library with a pricing rule per
product and region (160 of them, written out as source when the script is
loaded), stands for what a real main script holds beside its jobs, with a few
imports: what a worker runs again as it starts, where the engine's workers
import the main module each (spawn, or a forkserver that does not preload
it), and what a fork or a forkserver that preloads it spares them.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import decimal
import fractions
import json
import os
import random
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
# The size and shape of a real one: data classes, parsing, rules per product
# and per region, reports. None of it runs at import but the definitions
# themselves (and the writing out of the rules' source: see below).

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


# --- the pricing rules: one function per product and region -----------------------------
# Written out as source when the script is loaded (the same each time: the
# generator is seeded) and compiled as the script's own code, 1,760 lines of
# it: a worker that runs the main module again parses and compiles every rule,
# as it would a long file. (Kept out of the repository as text: it is filler.)

ITEMS = (
    "bearing", "bracket", "bushing", "clamp", "coupler", "flange", "gadget", "gasket", "hinge", "nozzle",
    "pulley", "relay", "rivet", "sensor", "spindle", "sprocket", "switch", "valve", "washer", "widget",
)  # fmt: skip
REGIONS = ("north", "south", "east", "west", "central", "coastal", "alpine", "island")
RULE = """def price_{item}_{region}(quantity: int, day: datetime.date) -> decimal.Decimal:
    \"\"\"The unit price of a {item} shipped to the {region} region, by volume and day.\"\"\"
    price = money("{base}")
    tiers = min(quantity // {per}, {most})
    if tiers:
        price -= money(price * decimal.Decimal(tiers * {off}) / 100)
    if day.weekday() >= 5:
        price += money("{weekend}")
    return max(price, money("0.01"))
"""


def rules_source() -> str:
    """The source of every pricing rule (the same each time)."""
    draw = random.Random(1896)
    rules = []
    for item in ITEMS:
        for region in REGIONS:
            base, weekend = draw.uniform(5, 99), draw.uniform(0.05, 0.99)
            per, most, off = draw.choice((5, 10)), draw.randint(2, 8), draw.randint(2, 5)
            rules.append(RULE.format(item=item, region=region, base=f"{base:.2f}", per=per, most=most, off=off,
                                     weekend=f"{weekend:.2f}"))  # fmt: skip
    return "\n\n".join(rules)


exec(compile(rules_source(), f"{__file__} (pricing rules)", "exec"))

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
