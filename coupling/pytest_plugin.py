"""A pytest plugin: the conformance assertions as fixtures, tuned from the command line.

Installed with the package (entry point ``pytest11``), so an engine's test suite needs one
test and no import::

    def test_my_verifier_is_lossless(assert_lossless):
        assert_lossless(my_verify)                          # 20 000 loops per pair by default

    def test_my_loop_is_lossless(assert_generation_lossless):
        assert_generation_lossless(my_generate, processing=my_top_k)

``pytest --coupling-draws 2000`` runs every such check with fewer loops (a quick local run),
``--coupling-seed S`` draws other models and numbers (a nightly run over seeds); arguments the
test passes win over both. The fixtures are :func:`coupling.testing.assert_lossless` and
:func:`coupling.testing.assert_generation_lossless`.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

__all__ = ["pytest_addoption", "assert_lossless", "assert_generation_lossless"]


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("coupling", "conformance checks of speculative-decoding verifiers")
    group.addoption("--coupling-draws", type=int, default=None, metavar="N",
                    help="generation loops per model pair in the coupling fixtures "
                         "(the checker's default: 20000)")
    group.addoption("--coupling-seed", type=int, default=None, metavar="S",
                    help="seed of the models and draws in the coupling fixtures (0)")


def _tuned(request: pytest.FixtureRequest, check: Callable) -> Callable:
    options = {name: request.config.getoption(f"--coupling-{name}") for name in ("draws", "seed")}

    def run(verify, **kwargs):
        exact = kwargs.get("exact", False)       # an exact check samples nothing
        tuned = {k: v for k, v in options.items()
                 if v is not None and not (exact and k == "draws")}
        return check(verify, **{**tuned, **kwargs})

    return run


@pytest.fixture
def assert_lossless(request: pytest.FixtureRequest) -> Callable:
    """``assert_lossless(verify, **check_kwargs)`` with ``--coupling-draws`` and
    ``--coupling-seed`` applied (:func:`coupling.testing.assert_lossless`)."""
    from .testing import assert_lossless as check

    return _tuned(request, check)


@pytest.fixture
def assert_generation_lossless(request: pytest.FixtureRequest) -> Callable:
    """``assert_generation_lossless(generate, **kwargs)`` with ``--coupling-draws`` and
    ``--coupling-seed`` applied (:func:`coupling.testing.assert_generation_lossless`)."""
    from .testing import assert_generation_lossless as check

    return _tuned(request, check)
