"""Maintainers: put the SmolLM2 miniature's trained drafters into zoo/ and refresh their cards.

    python scripts/ship_miniature.py ship RUNS_DIR      # RUNS_DIR/smollm2-{dflash,dpace,mfd}/final
    mfd-hub bench --limit 20 --out bench/humaneval && cp bench/humaneval/results.json zoo/bench-humaneval.json
    python scripts/ship_miniature.py cards              # cards again, now with the benchmark's rows
    python scripts/ship_miniature.py record             # acceptance records of the drafters in zoo/
    python scripts/ship_miniature.py verify             # verify reports (and cards) again

Each shipped drafter is stored in bf16 with its acceptance record (`acceptance.json`, measured
against SmolLM2 as shipped), verified against SmolLM2 (`verify.json`) and given a card rendered
from the checkpoint, that record and report and zoo/bench-humaneval.json. `record` measures the
records of the drafters already in zoo/ (their weights untouched) and refreshes reports and cards.
"""

import sys
from pathlib import Path

from mfd_hub.zoo.ship import record_shipped_acceptance, reverify_shipped, ship_drafter, write_shipped_card
from mfd_hub.zoo.shipped import SHIPPED_DRAFTERS

RUNS = {"DFlash-SmolLM2-135M": "smollm2-dflash", "DPACE-SmolLM2-135M": "smollm2-dpace", "MFD-SmolLM2-135M": "smollm2-mfd"}


def main(argv):
    if argv[:1] == ["ship"] and len(argv) == 2:
        for name, run in RUNS.items():
            print(f"shipping {name} from {Path(argv[1]) / run / 'final'}")
            ship_drafter(Path(argv[1]) / run / "final", name)
    elif argv == ["record"]:
        for name in SHIPPED_DRAFTERS:
            print(f"recording the acceptance of {name}")
            record_shipped_acceptance(name)
    elif argv == ["verify"]:
        for name in SHIPPED_DRAFTERS:
            print(f"verifying {name}")
            reverify_shipped(name)
    elif argv == ["cards"]:
        for name in SHIPPED_DRAFTERS:
            write_shipped_card(name)
            print(f"card of {name} written")
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
