"""Helpers the tests and bench/ scripts share that are not part of the installed package
(``chromium``: the headless-browser driver for the report's page)."""
