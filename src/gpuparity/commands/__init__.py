"""Subcommands of the CLI: parse and render only; the work is in the library."""
