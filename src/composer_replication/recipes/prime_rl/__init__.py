"""prime-rl recipe: the Composer channels for prime-rl's custom-loss plug point (see ``example.toml``)."""
