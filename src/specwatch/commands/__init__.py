"""The ``specwatch`` commands that ``specwatch.cli`` registers, and what they share (options, output)."""
