"""Write tests/module_costs.json (each test module's seconds) from a test run's JUnit XML, so
tests/conftest.py starts the longest modules first:

    bash test.sh --junitxml=/tmp/junit.xml && .venv/bin/python scripts/module_costs.py /tmp/junit.xml
"""
from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def module_costs(junit: Path) -> dict[str, float]:
    """'tier/test_x.py' -> seconds, summed over the module's test cases."""
    out: dict[str, float] = defaultdict(float)
    for case in ET.parse(junit).getroot().iter("testcase"):
        module = case.get("classname", "").split(".")
        # classname: tests.<tier>.test_x[.Class]; the module is the first test_* part
        parts = module[1:] if module[:1] == ["tests"] else module
        name = next((i for i, p in enumerate(parts) if p.startswith("test_")), None)
        if name is None:
            continue
        out["/".join(parts[:name + 1]) + ".py"] += float(case.get("time", 0) or 0)
    return {k: round(v, 1) for k, v in sorted(out.items(), key=lambda kv: -kv[1])}


def main() -> int:
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    costs = module_costs(Path(sys.argv[1]))
    (ROOT / "tests" / "module_costs.json").write_text(json.dumps(costs, indent=1) + "\n")
    print(f"{len(costs)} modules, {sum(costs.values()) / 60:.1f} min of tests in all")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
