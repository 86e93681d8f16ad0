"""specwatch: benchmark and regression tracking for SGLang speculative decoding."""

__version__ = "0.1.0"
