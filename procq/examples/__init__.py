"""Small examples shipped with procq: ``stage`` holds functions for
``procq run``, and ``numbers.jsonl`` an input for them::

    python -m procq run procq.examples.stage:square \
        --input "$(python -c 'import procq.examples as e; print(e.NUMBERS)')"
"""

from pathlib import Path

#: The path of ``numbers.jsonl``: the numbers 1 to 20, one JSON value per line.
NUMBERS = str(Path(__file__).with_name("numbers.jsonl"))
