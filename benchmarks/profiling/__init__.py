"""Where the time goes, per kernel or per detector part: diagnostics, no goals."""
