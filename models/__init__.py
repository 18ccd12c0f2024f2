"""Per-model folders: reference, presets, checkpoint loader, export split and runtime pipeline."""
