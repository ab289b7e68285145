"""Loading from the Hub or a folder, model cards, uploads."""
