"""Built-in ``kvsim`` subcommands; each module exposes ``add_command(subparsers)``."""
