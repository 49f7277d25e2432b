"""The admin token of the tests' servers: they take it with ``ADMIN_FLAGS`` (the variable is set
by ``tests/conftest.py``), and callers of ForgetUser, HideItems and UnhideItems send it."""

ADMIN_TOKEN = "tests-admin-token-0123456789"
ADMIN_ENV = "ORDREC_TESTS_ADMIN_TOKEN"
ADMIN_FLAGS = ("--admin-token-env", ADMIN_ENV)
ADMIN_METADATA = (("authorization", f"Bearer {ADMIN_TOKEN}"),)
