"""The CPU tier: SGLang's own sizing and allocator classes driven without a GPU."""
