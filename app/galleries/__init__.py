"""Galleries (one embedding space each): their rows, vector writes and index upkeep, and how a
model's queries enter a gallery's frame (``frames``)."""
