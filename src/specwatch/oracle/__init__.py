"""The oracle models: shapes, closed-form greedy predictions, prompts and digests, and the checkpoints specwatch writes."""
