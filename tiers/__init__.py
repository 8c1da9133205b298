"""Built-in asynctier tiers, one module each; registered lazily by module path in ``asynctier``."""
