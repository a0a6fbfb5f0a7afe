import lmhp_events  # noqa: F401  (the tests' audit hook, in every run a test starts with this folder on PYTHONPATH)
