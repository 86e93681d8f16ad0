"""What the records say: comparisons, noise, DCP support, suite health, harness overhead, roofline."""
