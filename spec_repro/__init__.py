"""spec_repro: reproduce "Speculative Decoding: Performance or Illusion?" (arXiv 2601.11580).

Data flows one way: workload -> engine run -> trace -> cost model / simulator -> figure.
"""
__version__ = "0.2.0"
