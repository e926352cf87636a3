"""Benchmarks of rlx: ``bench/overhead.py`` (dispatch overhead) and ``bench/suite.py`` (the model suite).

A package only so that the suite's modules import each other by one name (``bench.models``)
whether they run as ``python bench/suite.py``, ``python -m bench.suite`` or from a test.
"""
