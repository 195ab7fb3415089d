"""An exported ReDet package (tools/export.py) against the model as the tools run it."""
