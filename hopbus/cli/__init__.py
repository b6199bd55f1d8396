"""The typer CLI: a thin layer that parses, builds a RunConfig and calls the library."""
