"""What every layer speaks: cases, records, errors, the installed SGLang, the timing lock, the worker protocol."""
