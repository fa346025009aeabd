"""One module per subcommand: ``register(subparsers)`` adds its parser, ``main(args)`` runs it."""
