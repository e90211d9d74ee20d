"""CI: a JUnit report in which tests ran and none skipped, failed or errored (the optional backends' suites, which
must run rather than skip where CI installed them).

    python scripts/check_junit.py NAME REPORT.xml
"""

import sys
import xml.etree.ElementTree as ET


def main(name: str, path: str) -> None:
    suites = list(ET.parse(path).getroot().iter("testsuite"))
    n = {k: sum(int(s.get(k, 0)) for s in suites) for k in ("tests", "skipped", "failures", "errors")}
    if n["tests"] == 0 or n["skipped"] or n["failures"] or n["errors"]:
        sys.exit(f"{name} tests: {n}; every test must run and pass, none may skip")
    print(f"{name} tests: {n['tests']} ran, none skipped")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
