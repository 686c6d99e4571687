"""Tests of the verification rules, one file per rule folder of ``coupling.rules``."""
