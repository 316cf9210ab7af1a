"""The `theinference` command line: `app.py` lists every command; one module per command group."""
