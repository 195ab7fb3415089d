"""Checks of the benchmarks' own code on the CPU (their options, their summaries, one short run):
the test command runs them with the tests (pytest.ini); the numbers come from a GPU."""
