"""The pytest plugin: an engine's suite gets the conformance assertions as fixtures, with
``--coupling-draws`` and ``--coupling-seed`` from the command line."""

from __future__ import annotations

pytest_plugins = ["pytester"]

SUITE = '''
from coupling.conformance import from_rule
from coupling.conformance.museum import ArgmaxVerifier


def test_lossless(assert_lossless):
    report = assert_lossless(from_rule("token"), gamma=2)
    assert report.draws == 300 and report.seed == 5


def test_exact_ignores_draws(assert_lossless):
    assert assert_lossless(from_rule("token"), gamma=1, exact=True).mode == "exact"


def test_lossy(assert_lossless):
    assert_lossless(ArgmaxVerifier(), gamma=1, draws=600)
'''


def test_the_fixtures_take_the_command_line_settings(pytester):
    pytester.makepyfile(test_engine=SUITE)
    result = pytester.runpytest_subprocess("--coupling-draws", "300", "--coupling-seed", "5",
                                           "-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["*verifier is not lossless*", "*smallest failing case*"])
