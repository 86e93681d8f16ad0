"""The child process that drives one ``sglang.Engine`` (``python -m specwatch.worker``); no other module imports it."""
