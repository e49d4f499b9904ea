"""What every game shares, whatever its family: configs (base.py) and settings schemas (settings.py)."""
