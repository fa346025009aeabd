"""simulator: a discrete-event simulator of GPU clusters running distributed LLM training.

Data flows one way: config -> model math -> layout -> op graph -> engine -> report; the CLI
sits on top. See README.md for a tour of the code.
"""

__version__ = "0.1.0"
