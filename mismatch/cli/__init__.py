"""The command line: `app` (the typer app and `main`), one module per command group, `common` (the one
error handler), `tables` (rich tables). Imports no library module until a command runs."""
