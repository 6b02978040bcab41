"""Topic modules: each defines ``TOPICS``, a list of ``registry.Topic``; helpers shared by them live in ``_common``."""
