"""The norm layers and what each declares about itself (the ``norm=`` registry)."""
