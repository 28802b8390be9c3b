"""The ``rlhfless`` command line and its subcommands (deploy, profile, tiny-model, report)."""
