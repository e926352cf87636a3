"""Listed in RLX_DISABLE_PLUGINS by the tests: importing it at all is the failure."""

raise AssertionError("rlxfake_disabled was imported although RLX_DISABLE_PLUGINS lists it")
