"""What specwatch puts into SGLang's processes: the probe, named faults, and commit overlays."""
