"""The results store: JSONL files of records and runs (I/O), the records frame, and selections."""
