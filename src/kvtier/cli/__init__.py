"""kvtier's command line (Typer for parsing, Rich for output)."""
