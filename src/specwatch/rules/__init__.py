"""What specwatch knows about SGLang, for producer and reader alike: validity rules, the memory model, pool verdicts, crash causes."""
