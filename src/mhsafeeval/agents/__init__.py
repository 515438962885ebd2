"""agents layer (see STYLE.md)."""
