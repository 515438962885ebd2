"""judges layer (see STYLE.md)."""
