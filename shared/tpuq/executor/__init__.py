"""The executor's core: run an attempt on every worker of a TPU and tell how it ended."""
