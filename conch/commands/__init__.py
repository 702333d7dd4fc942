"""CLI subcommands. Each module: `register(subparsers)`; heavy imports only inside the command function."""
