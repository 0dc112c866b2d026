"""thattn: talking-heads attention and its relatives for tf-keras."""

__version__ = "0.1.0"
