"""Own models and prompts: checkpoints a suite names by path or Hugging Face id, and prompt sets
read from local dataset files (``checkpoint``, ``prompts``, ``suite_model``)."""
