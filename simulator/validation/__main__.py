"""``python -m simulator.validation``: print the validation table; exit 1 if a case fails."""

import sys

from . import report, validate

results = validate()
print(report(results))
sys.exit(0 if all(r.passed for r in results) else 1)
