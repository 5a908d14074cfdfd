"""Fixtures more than one folder of tests uses."""

from __future__ import annotations

import pytest
from support.pki import CA


@pytest.fixture(scope="module")
def ca() -> CA:
    """A throw-away CA (support/pki.py), one per test module: the mutual-TLS tests of the
    controller and of the GPU agent issue their certificates from it."""
    return CA()
