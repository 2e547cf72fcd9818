"""The installed package is the source tree: every Python package under estimator/ (and rules/,
installed as estimator.rules) is listed in pyproject.toml, so a wheel or a non-editable install
carries it (an editable install, as CI's, would not notice a missing one)."""

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _packages_on_disk() -> set[str]:
    found = set()
    for top, name in (("estimator", "estimator"), ("rules", "estimator.rules")):
        base = os.path.join(ROOT, top)
        for dirpath, dirnames, filenames in os.walk(base):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            if "__init__.py" in filenames:
                rel = os.path.relpath(dirpath, base)
                found.add(name if rel == "." else f"{name}.{rel.replace(os.sep, '.')}")
    return found


def test_every_package_is_listed_in_pyproject():
    # the [tool.setuptools] lines read as text: tomllib is Python 3.11+, the project supports 3.10
    with open(os.path.join(ROOT, "pyproject.toml")) as fh:
        text = fh.read()
    listed = re.search(r"^packages = \[(.*?)\]$", text, re.M | re.S).group(1)
    assert set(re.findall(r'"([^"]+)"', listed)) == _packages_on_disk()
    assert re.search(r'^"estimator.rules" = "rules"$', text, re.M)
