"""What the distributions carry: the license.

Building an sdist and a wheel needs an isolated build environment fetched from
an index (setuptools >= 77 and the pinned mypy), so this suite does not build;
it pins what the builds are made from. ``python -m build`` from this tree puts
``LICENSE`` at the top of the sdist and in the wheel's
``.dist-info/licenses/``, with ``License-File: LICENSE`` in its metadata.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_license_file_is_the_apache_2_0_text() -> None:
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")

    lines = [line.strip() for line in text.splitlines() if line.strip()]
    assert lines[:3] == [
        "Apache License",
        "Version 2.0, January 2004",
        "http://www.apache.org/licenses/",
    ]
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
    assert "END OF TERMS AND CONDITIONS" in text
    assert "9. Accepting Warranty or Additional Liability." in text


def test_pyproject_declares_the_license_and_ships_its_file() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    project = pyproject["project"]

    assert project["license"] == "Apache-2.0"
    assert project["license-files"] == ["LICENSE"]
    # license-files (PEP 639) needs setuptools 77 or later to build.
    assert "setuptools>=77" in pyproject["build-system"]["requires"]
