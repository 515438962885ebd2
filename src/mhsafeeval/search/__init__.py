"""search layer (see STYLE.md)."""
