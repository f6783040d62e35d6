"""Training data of an upgrade: the new backbone's features paired with a gallery's items, labels
and query logs."""
