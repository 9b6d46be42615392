"""Recipes: data-juicer recipes (replaysim/), the prime-rl loss (prime_rl/), Monarch actors (monarch/)."""
